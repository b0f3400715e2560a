"""Student content as HTML that runs nothing: the one place the grader's pages are made safe.

Everything a student wrote or printed (markdown, HTML and SVG outputs, written answers) reaches
the pages the grader writes (feedback pages, the hand-grading pages) only through here:

* markdown becomes HTML with its math typeset as MathML (Chromium and Firefox show it with no
  script and no network), then
* every fragment goes through an allow-list sanitiser (``nh3``, Ammonia's): the tags of text,
  tables, lists, images and MathML survive, with the attributes they need; scripts, event
  handlers, styles, forms, frames, ``javascript:`` links and remote images do not;
* bidi controls (a right-to-left override) are shown as ``&lt;U+202E&gt;`` in every fragment and
  page (``autograder.text.visible``): ``sanitize``, ``escape`` and ``page``;
* every page also sends a Content-Security-Policy that allows no script at all, inline or
  remote, and loads nothing from the network (``CSP``).
"""
from __future__ import annotations

import html
import re

import nh3

from .visible import visible, visible_html

# Imports inside functions: nbconvert's markdown renderer and latex2mathml are imported when markdown or
# math is converted: the command line imports this module's sanitiser without them.

MATHML_TAGS = {"math", "mi", "mo", "mn", "ms", "mtext", "mspace", "mrow", "mfrac", "msqrt", "mroot", "mstyle",
               "merror", "mpadded", "mphantom", "menclose", "msub", "msup", "msubsup", "munder", "mover",
               "munderover", "mmultiscripts", "mprescripts", "none", "mtable", "mtr", "mtd", "mlabeledtr",
               "semantics", "annotation"}
MATHML_ATTRIBUTES = {"display", "mathvariant", "displaystyle", "scriptlevel", "stretchy", "fence", "separator",
                     "lspace", "rspace", "minsize", "maxsize", "accent", "accentunder", "movablelimits",
                     "linethickness", "width", "height", "depth", "notation", "columnalign", "rowalign",
                     "columnspacing", "rowspacing", "columnlines", "rowlines", "frame", "encoding"}
TAGS = (set(nh3.ALLOWED_TAGS) | MATHML_TAGS | {"img", "figure", "figcaption", "details", "summary", "span", "div",
                                               "table", "thead", "tbody", "tfoot", "tr", "th", "td", "caption",
                                               "sup", "sub", "kbd", "samp", "var", "mark"}) - {"style", "script"}
ATTRIBUTES = {"*": {"class", "title", "lang", "dir"},
              "a": {"href", "title"}, "img": {"src", "alt", "width", "height"},
              "th": {"colspan", "rowspan", "scope", "align"}, "td": {"colspan", "rowspan", "align"},
              "ol": {"start", "type"}, "code": {"class"}, "pre": {"class"},
              **{tag: MATHML_ATTRIBUTES | {"class"} for tag in MATHML_TAGS}}
ATTRIBUTES["math"] = ATTRIBUTES["math"] | {"xmlns"}
# no script, no connection: images are inline data, styles the page's own
CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:; "
       "form-action 'none'; base-uri 'none'; frame-ancestors 'none'")
CSP_META = f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
_DATA_IMAGE = re.compile(r"data:image/(png|jpe?g|gif|webp|svg\+xml);base64,[A-Za-z0-9+/=\s]*\Z", re.I)


def _attribute(element: str, attribute: str, value: str) -> str | None:
    """Per-attribute rule on top of the allow-list: images only as inline data, links only to
    web pages, mail or anchors on the page."""
    if element == "img" and attribute == "src":
        return value if _DATA_IMAGE.match(value.strip()) else None
    if element == "a" and attribute == "href":
        v = value.strip()
        return value if v.startswith("#") or re.match(r"(https?|mailto):", v, re.I) else None
    return value


def sanitize(fragment: str) -> str:
    """``fragment`` (HTML from a student's notebook) with only the allowed tags and attributes."""
    return visible_html(nh3.clean(str(fragment), tags=TAGS, attributes=ATTRIBUTES, attribute_filter=_attribute,
                                  url_schemes={"http", "https", "mailto", "data"},
                                  link_rel="noopener noreferrer nofollow", strip_comments=True))


def escape(text) -> str:
    """Plain text (a name, a file name, a reason) as HTML text, bidi controls shown."""
    return html.escape(visible(str(text)))


def page(markup: str) -> str:
    """A whole page the grader writes, bidi controls shown wherever they are in it."""
    return visible_html(markup)


def tex_to_mathml(tex: str, display: bool = False) -> str:
    """MathML for a TeX formula; the formula as code when it cannot be converted."""
    from latex2mathml.converter import convert

    try:
        return convert(tex, display="block" if display else "inline")
    except Exception:  # noqa: BLE001 - an unknown command or malformed TeX: show it as written
        return f"<code>{html.escape(tex)}</code>"


def _renderer():
    """nbconvert's markdown renderer with math typeset as MathML and images only inline."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer

    class MathMLRenderer(IPythonRenderer):
        def block_math(self, body: str) -> str:
            return tex_to_mathml(body, display=True)

        def latex_environment(self, name: str, body: str) -> str:
            return tex_to_mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", display=True)

        def inline_math(self, body: str) -> str:
            return tex_to_mathml(body)

        def image(self, text: str, url: str, title: str | None = None) -> str:
            # attachments are dropped at intake and remote images never load: keep the words
            if not _DATA_IMAGE.match(url or ""):
                return f"<em>[image: {html.escape(text or url or '')}]</em>"
            return super().image(text, url, title)

    return MathMLRenderer(escape=False)


def markdown_to_html(source: str) -> str:
    """A markdown cell or output as safe HTML, math as MathML."""
    from nbconvert.filters.markdown_mistune import MarkdownWithMath

    try:
        rendered = MarkdownWithMath(renderer=_renderer()).render(str(source))
    except Exception:  # noqa: BLE001 - markdown no renderer accepts: show it as text
        rendered = f"<pre>{html.escape(str(source))}</pre>"
    return sanitize(rendered)


def latex_to_html(source: str) -> str:
    """A text/latex output (``$...$`` or ``$$...$$``) as MathML."""
    text = str(source).strip()
    m = re.fullmatch(r"\$\$(.*)\$\$|\$(.*)\$|\\\[(.*)\\\]", text, re.S)
    if m is None:
        return sanitize(f"<pre>{html.escape(text)}</pre>")
    tex = next(g for g in m.groups() if g is not None)
    return sanitize(tex_to_mathml(tex, display=not text.startswith("$") or text.startswith("$$")))
