"""Rewrite docs/config.md from the config schema: python scripts/gen_config_doc.py"""

from pathlib import Path

from temper.config.doc import render_config_doc

OUT = Path(__file__).resolve().parents[1] / "docs" / "config.md"

if __name__ == "__main__":
    OUT.write_text(render_config_doc())
    print(f"wrote {OUT}")
