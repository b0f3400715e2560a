"""The LLM lab on other backends (coursekit/llm/), against real programs, not stand-ins.

* ``openai``: the module starts ``transformers serve`` (the OpenAI-compatible server of the
  pinned transformers) on 127.0.0.1, serving the course's small GPT exported as a GPT-2
  checkpoint, and runs the whole lab notebook through it, as a student would with
  ``COURSE_LLM_BACKEND=openai``. That run uses an API key; the notebook is then handed in
  through ``python -m autograder grade`` (from a shell that still holds the key and the
  backend setting), and no file the notebook or the grader wrote contains the key.
* ``llamacpp``: where ``llama-cpp-python`` is installed (it compiles llama.cpp, so it is not
  in requirements.txt; see docs/LLM_BACKENDS.md), the course GPT exported as a GGUF file gives
  the same next-token distribution as the model itself, and the lab's experiment cells run on it.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
import torch

from conftest import ROOT, filled_exercise

KEY = "sk-course-test-" + os.urandom(12).hex()  # a fresh key each run: found anywhere means leaked
SERVER_START_S = 120  # an import of torch and transformers on a busy 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def small_gpt():
    from coursekit.gpt import load_or_train_small_gpt

    model, tokenizer, _ = load_or_train_small_gpt(verbose=False)
    return model, tokenizer


@pytest.fixture(scope="module")
def server(tmp_path_factory, small_gpt):
    """`transformers serve` on 127.0.0.1 with the course GPT; yields (base_url, model name)."""
    from coursekit.llm import export_small_gpt

    folder = export_small_gpt(tmp_path_factory.mktemp("served") / "small-gpt", fmt="hf",
                              model=small_gpt[0], tokenizer=small_gpt[1])
    port = _free_port()
    log = tmp_path_factory.mktemp("server-log") / "serve.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", HF_HOME=str(log.parent / "hf"))
    cmd = [str(Path(sys.executable).parent / "transformers"), "serve", str(folder), "--host", "127.0.0.1",
           "--port", str(port), "--device", "cpu"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, f"transformers serve exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"transformers serve not up in {SERVER_START_S} s:\n" \
                                                f"{log.read_text()[-3000:]}"
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1", str(folder)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _api_env(base_url, model):
    return {"COURSE_LLM_BACKEND": "openai", "COURSE_LLM_BASE_URL": base_url, "COURSE_LLM_MODEL": model,
            "COURSE_LLM_KIND": "text", "OPENAI_API_KEY": KEY, "COURSE_MODEL_SOURCE": "offline"}


@contextlib.contextmanager
def _environ(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: v for k, v in values.items() if v is not None})
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_notebook(nb, env: dict):
    """Execute ``nb`` in a fresh kernel with ``env`` added, as a student's run; returns
    {grade_id: text of its outputs} (errors as 'ERROR name: value')."""
    from nbclient import NotebookClient

    with _environ(MPLBACKEND=None, **env):  # the inline backend, as in Jupyter
        NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(ROOT / "exercises" / "llm_lab")}}).execute()
    texts = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        parts = []
        for o in cell.get("outputs", []):
            if o.output_type == "stream":
                parts.append(o.text)
            elif o.output_type == "error":
                parts.append(f"ERROR {o.ename}: {o.evalue}")
            elif "text/plain" in o.get("data", {}):
                parts.append(o["data"]["text/plain"])
        texts[cell.metadata["nbgrader"]["grade_id"]] = "".join(parts)
    return texts


def _table(text: str) -> dict:
    """The rows of the table that show() prints: {setting: [column values]}."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("setting "))
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows[line[:32].strip()] = line[32:].split()
    return rows


def _lab(n_samples: int, max_new_tokens: int | None = None):
    """The filled lab notebook with fewer samples per setting (and, for the news model, fewer
    new tokens), to keep the suite short; everything else as a student runs it."""
    nb = filled_exercise("llm_lab")
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "experiment_tools")
    assert "N_SAMPLES = 4 " in cell.source and "    MAX_NEW_TOKENS = 32\n" in cell.source
    cell.source = cell.source.replace("N_SAMPLES = 4 ", f"N_SAMPLES = {n_samples} ")
    if max_new_tokens is not None:
        cell.source = cell.source.replace("    MAX_NEW_TOKENS = 32\n", f"    MAX_NEW_TOKENS = {max_new_tokens}\n")
    return nb


@pytest.fixture(scope="module")
def lab_through_server(server, tmp_path_factory):
    """The filled lab notebook run with COURSE_LLM_BACKEND=openai and a key, as handed in."""
    nb = _lab(n_samples=2)
    texts = _run_notebook(nb, _api_env(*server))
    path = tmp_path_factory.mktemp("handed-in") / "keyuser_llm_lab.ipynb"
    nbformat.write(nb, path)
    return texts, path


def test_lab_runs_through_the_openai_compatible_server(lab_through_server, server):
    texts, _ = lab_through_server
    errors = {gid: t for gid, t in texts.items() if "ERROR" in t}
    assert not errors, errors
    assert f"at {server[0]}" in texts["load_model"] and "the server samples" in texts["load_model"]
    first = texts["first_answer"]
    assert "greedy:" in first and "sampled (temperature 0.8, top-p 0.9):" in first
    basic = texts["basic_experiments"]
    # every setting ran through the server, except top-k, which transformers serve refuses
    assert "temperature 1.0, top-k 20: skipped" in basic and "does not take top_k" in basic
    rows = _table(basic)
    assert set(rows) == {"greedy", "temperature 0.7", "temperature 1.0", "temperature 1.5",
                         "temperature 1.0, top-p 0.9"}
    for name, cols in rows.items():
        assert len(cols) == 4 and cols[3] == "n/a", (name, cols)  # this server reports no log-probs
        assert all(0.0 <= float(c) <= 1.0 for c in cols[:3]), (name, cols)
    # greedy loops more and varies less than sampling at temperature 1.5
    assert float(rows["greedy"][1]) < float(rows["temperature 1.5"][1])
    # each call says what it used: 4 prompts x 2 samples x 32 tokens, no cost on this machine
    usage = [line for line in basic.splitlines() if line.startswith("[")]
    assert len(usage) == 5 and all("8 requests" in u and "256 generated" in u and "no cost" in u for u in usage)
    own = texts["own_experiment"]
    assert "greedy, frequency penalty 1" in own and "top-p 0.9, frequency penalty 1" in own


def test_a_notebook_that_used_a_key_hands_in_without_it(lab_through_server, tmp_path):
    """Graded from a shell that holds the key and asks for the API: the kernels run the
    offline model (pinned by course.yml), and no file written contains the key."""
    texts, handed_in = lab_through_server
    assert KEY not in handed_in.read_text()
    subs = tmp_path / "submissions"
    subs.mkdir()
    (subs / handed_in.name).write_bytes(handed_in.read_bytes())
    grading = tmp_path / "grading"
    env = dict(os.environ, OPENAI_API_KEY=KEY, COURSE_LLM_BACKEND="openai",
               COURSE_LLM_BASE_URL="http://127.0.0.1:9/v1", COURSE_LLM_MODEL="gpt-4o-mini")
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", "llm_lab", str(subs),
                           "--grading-dir", str(grading), "--out", str(tmp_path / "reports"), "--workers", "1"],
                          cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert KEY not in proc.stdout + proc.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent != subs]
    autograded = [p for p in written if p.suffix == ".ipynb" and "autograded" in p.parts]
    feedback = [p for p in written if p.suffix == ".html"]
    assert autograded and feedback, sorted(str(p.relative_to(tmp_path)) for p in written)
    leaked = [str(p.relative_to(tmp_path)) for p in written if KEY.encode() in p.read_bytes()]
    assert not leaked, leaked
    # the grader re-ran the experiments on the offline model, not on the API the shell named
    graded = nbformat.read(autograded[0], as_version=4)
    load = next(c for c in graded.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "load_model")
    out = "".join(o.get("text", "") for o in load.outputs)
    assert "small GPT from coursekit.gpt" in out and "full next-token logits" in out, out


def test_errors_are_one_line_and_never_show_the_key(server, capsys):
    import httpx
    import openai

    from coursekit.llm import LLMError, OpenAIModel

    base_url, model = server
    with _environ(OPENAI_API_KEY=KEY):
        lm = OpenAIModel(model, base_url, kind="text", timeout=0.001)
        lm.client = lm.client.with_options(max_retries=0)
        with pytest.raises(LLMError) as err:  # a real request that cannot be answered in 1 ms
            lm.sample(["Oil prices"], 1, 8)
        assert "no answer from 127.0.0.1" in str(err.value) and "COURSE_LLM_TIMEOUT" in str(err.value)
        assert err.value._render_traceback_() == [f"LLMError: {err.value}"]  # what a notebook shows

        other = OpenAIModel("some-other-model", base_url, kind="text")  # this server serves one model
        with pytest.raises(LLMError, match=r"rejected the request \(HTTP 400\)"):
            other.sample(["Oil prices"], 1, 8)
        closed = OpenAIModel(model, f"http://127.0.0.1:{_free_port()}/v1", kind="text")
        closed.client = closed.client.with_options(max_retries=0)
        with pytest.raises(LLMError, match="cannot reach http://127.0.0.1:.*is the server running"):
            closed.sample(["Oil prices"], 1, 8)
        # what the client raises for HTTP 429 and 401 (a server that counts requests is not at hand)
        request = httpx.Request("POST", f"{base_url}/completions")
        limited = openai.RateLimitError("Error code: 429", response=httpx.Response(429, request=request),
                                        body={"error": {"message": f"Rate limit reached for key {KEY}"}})
        line = str(lm._explain(limited))
        assert "HTTP 429" in line and "Wait a minute" in line and KEY not in line and "\n" not in line
        refused = openai.AuthenticationError("Error code: 401", response=httpx.Response(401, request=request),
                                             body={"error": {"message": f"Incorrect API key provided: {KEY}"}})
        line = str(lm._explain(refused))
        assert "did not accept the API key" in line and "OPENAI_API_KEY" in line and KEY not in line
        assert KEY not in repr(lm) + repr(vars(lm)) + lm.description + capsys.readouterr().out


def test_usage_and_cost_of_each_call(server, capsys):
    from coursekit.llm import OpenAIModel

    base_url, model = server
    lm = OpenAIModel(model, base_url, kind="text", price=(0.15, 0.60))
    samples = lm.sample(["Oil prices", "Microsoft"], n_samples=2, max_new_tokens=5, seed=3, temperature=0.8)
    assert [s["group"] for s in samples] == [0, 0, 1, 1] and all(s["text"] for s in samples)
    line = capsys.readouterr().out.strip()
    used = lm.total
    assert used["requests"] == 4 and used["completion_tokens"] == 4 * 5
    cost = (used["prompt_tokens"] * 0.15 + used["completion_tokens"] * 0.60) / 1e6
    assert f"{used['completion_tokens']} generated" in line and f"estimated cost ${cost:.4f}" in line, line
    # the same seed gives the same text: the server seeds its sampler per request
    again = lm.sample(["Oil prices", "Microsoft"], n_samples=2, max_new_tokens=5, seed=3, temperature=0.8)
    assert [s["text"] for s in again] == [s["text"] for s in samples]


def test_the_server_runs_the_course_model(server):
    """Greedy text through the server is the greedy text of the model in this process."""
    from coursekit.llm import LocalSmallGPT, OpenAIModel

    api = OpenAIModel(server[1], server[0], kind="text", verbose=False)
    local = LocalSmallGPT()
    prompts = ["Oil prices", "The president said"]
    assert [s["text"] for s in api.sample(prompts, 1, 24, temperature=0)] == \
        [s["text"] for s in local.sample(prompts, 1, 24, temperature=0)]


def test_settings_and_keys(monkeypatch):
    from coursekit.llm import LLMError, OpenAIModel, api_key, llm_settings

    monkeypatch.setenv("COURSE_LLM_BACKEND", "openai")
    monkeypatch.setenv("COURSE_LLM_PINNED_BACKEND", "local")
    assert llm_settings().backend == "local"  # grading pins the local model
    monkeypatch.delenv("COURSE_LLM_PINNED_BACKEND")
    assert llm_settings().backend == "openai"
    monkeypatch.setenv("COURSE_LLM_BACKEND", "ollama")
    with pytest.raises(LLMError, match="COURSE_LLM_BACKEND='ollama'.*local, openai, llamacpp"):
        llm_settings()
    monkeypatch.delenv(KEY_VAR := "OPENAI_API_KEY", raising=False)
    assert api_key("http://localhost:11434/v1") is None  # a server on this machine: no key, none sent
    asked = []
    monkeypatch.setattr("getpass.getpass", lambda prompt: asked.append(prompt) or KEY)
    lm = OpenAIModel("gpt-4o-mini", "https://api.openai.com/v1", verbose=False)  # no request is made here
    assert asked and "api.openai.com" in asked[0] and KEY_VAR in asked[0]
    assert lm.price == (0.15, 0.60) and KEY not in repr(lm) + lm.description + repr(vars(lm)) + str(vars(lm))

    def no_terminal(prompt):
        raise EOFError

    monkeypatch.setattr("getpass.getpass", no_terminal)
    with pytest.raises(LLMError, match="no API key for api.openai.com: add the Colab secret OPENAI_API_KEY"):
        api_key("https://api.openai.com/v1")
    assert api_key("https://api.example.org/v1") is None  # another server: only a key named for it
    monkeypatch.setenv(KEY_VAR, KEY)
    assert api_key("https://api.openai.com/v1") == KEY
    assert api_key("https://api.example.org/v1") is None  # OPENAI_API_KEY goes to OpenAI only
    monkeypatch.setenv("COURSE_LLM_API_KEY", KEY + "-class")
    assert api_key("https://api.example.org/v1") == KEY + "-class"
    assert api_key("https://api.openai.com/v1") == KEY


def test_hf_export_is_the_course_model(small_gpt, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coursekit.llm import export_small_gpt

    model, tokenizer = small_gpt
    folder = export_small_gpt(tmp_path / "hf", model=model, tokenizer=tokenizer)
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    text = "\nOil prices rose on Monday as traders weighed supply"
    ids = torch.tensor([tokenizer.encode(text)])
    assert AutoTokenizer.from_pretrained(folder)(text)["input_ids"] == ids[0].tolist()
    with torch.no_grad():
        diff = float((hf(ids).logits - model(ids)[0]).abs().max())
    assert diff <= 1e-5, diff


# ------------------------------------------------------------------ llama.cpp in this process
def _llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        pytest.skip("llama-cpp-python is not installed (optional: it compiles llama.cpp; "
                    "see docs/LLM_BACKENDS.md)")
    return llama_cpp


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory, small_gpt):
    _llama_cpp()
    from coursekit.llm import export_small_gpt

    return export_small_gpt(tmp_path_factory.mktemp("gguf"), fmt="gguf", model=small_gpt[0], tokenizer=small_gpt[1])


def test_llamacpp_gives_the_course_models_distribution(gguf_file, small_gpt):
    from coursekit.llm import LlamaCppModel, LocalSmallGPT

    lm = LlamaCppModel(gguf_file)
    assert lm.kind == "text" and lm.has_logits and lm.n_ctx == small_gpt[0].config.block_size
    local = LocalSmallGPT.__new__(LocalSmallGPT)  # the local backend around the same weights
    local.model, local.tokenizer, local.device = small_gpt[0], small_gpt[1], torch.device("cpu")
    local.block_size = small_gpt[0].config.block_size
    ids = local.prompt_ids("Oil prices rose on Monday as traders")
    assert lm.prompt_ids("Oil prices rose on Monday as traders").tolist() == ids.tolist()
    batch = torch.cat([ids, ids.flip(1)])  # two different rows
    # llama.cpp's GELU is the tanh approximation: the log-probabilities agree to about 1e-3
    got, want = (torch.log_softmax(m.next_logits(batch), -1) for m in (lm, local))
    assert float((got - want).abs().max()) <= 5e-3
    for seq, start in [(torch.cat([ids] * 3, 1), 3),  # 36 tokens: one pass over the whole sequence
                       (torch.cat([ids] * 5, 1), 40)]:  # 60: longer than the context, the most recent tokens
        assert float((lm.token_logprobs(seq, start) - local.token_logprobs(seq, start)).abs().max()) <= 5e-3
    assert lm.decode(ids[0]) == local.decode(ids[0])


def test_llamacpp_chat_kind_uses_the_files_chat_template(small_gpt, tmp_path):
    """A GGUF file with a chat template: a prompt becomes the rendered conversation."""
    _llama_cpp()
    from coursekit.llm import LlamaCppModel, export_small_gpt

    template = "{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}{% endfor %}" \
               "{% if add_generation_prompt %} ->{% endif %}"
    path = export_small_gpt(tmp_path, fmt="gguf", model=small_gpt[0], tokenizer=small_gpt[1], chat_template=template)
    lm = LlamaCppModel(path)
    assert lm.kind == "chat"  # a file with a template is a chat model unless COURSE_LLM_KIND says text
    assert lm.prompt_ids("Oil prices?")[0].tolist() == small_gpt[1].encode("[user] Oil prices? ->")
    assert LlamaCppModel(path, kind="text").prompt_ids("Oil prices?")[0].tolist() == \
        small_gpt[1].encode("\nOil prices?")


def test_lab_experiment_cells_run_on_llamacpp(gguf_file):
    nb = _lab(n_samples=1, max_new_tokens=12)
    texts = _run_notebook(nb, {"COURSE_LLM_BACKEND": "llamacpp", "COURSE_LLM_MODEL": str(gguf_file),
                               "COURSE_MODEL_SOURCE": "offline"})
    errors = {gid: t for gid, t in texts.items() if "ERROR" in t}
    assert not errors, errors
    assert "llama.cpp" in texts["load_model"] and "full next-token logits" in texts["load_model"]
    rows = _table(texts["basic_experiments"])
    assert len(rows) == 6 and all(float(cols[3]) < 0 for cols in rows.values())  # log-probs from the model
    assert "no repeated 3-grams" in texts["own_experiment"]
