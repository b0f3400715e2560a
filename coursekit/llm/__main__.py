"""``python -m coursekit.llm export [--format hf|gguf] [--chat] [FOLDER]``: write the course's
model for another program (see ``coursekit.llm.export``)."""
from __future__ import annotations

import argparse
import sys

from coursekit.llm import interface
from coursekit.llm.export import export_offline_chat, export_small_gpt


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coursekit.llm", description=interface.__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="write the course's small GPT for transformers serve / vLLM (hf) "
                                       "or llama.cpp / Ollama (gguf)")
    ex.add_argument("--format", choices=("hf", "gguf"), default="hf")
    ex.add_argument("--chat", action="store_true", help="the offline chat model instead (hf only)")
    ex.add_argument("folder", nargs="?", help="where to write (default: the course cache)")
    args = parser.parse_args(argv)
    if args.chat and args.format != "hf":
        parser.error("--chat writes a transformers checkpoint: leave out --format gguf")
    print(export_offline_chat(args.folder) if args.chat else export_small_gpt(args.folder, fmt=args.format))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
