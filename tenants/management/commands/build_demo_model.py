from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Build the small random-weight demo model (Llama + GQA, local BPE tokenizer)."

    def add_arguments(self, parser):
        parser.add_argument("--out", default=str(settings.DEMO_MODEL_PATH))
        parser.add_argument("--force", action="store_true")

    def handle(self, *args, **opts):
        from injection.model.demo_model import build_demo_model

        path = build_demo_model(Path(opts["out"]), force=opts["force"])
        self.stdout.write(f"demo model at {path}")
