"""A model service process serving a zero-cost engine (bench/zero_cost_engines.py) through the real stack.

    python -m bench.zero_cost_service target|draft HIDDEN [FEATURE_LAYERS]     # configured by TANDEM_* too

Everything but the engine is what ``python -m services.model_main`` runs: settings, EngineHost, the
servicers, interceptors, health. Info's ``model_name`` reports the engine's time: "zero-cost
work_ns=N calls=M" (what the benchmark subtracts as compute).
"""

from __future__ import annotations

import logging
import sys

from services import engine_host
from services.model_main import serve
from services.settings import ServiceSettings
from shared.engine.features import FeatureSpec
from shared.event_loop import run_loop


class _StatsHost(engine_host.EngineHost):
    def info(self):
        info = super().info()
        info.model_name = f"zero-cost work_ns={self.engine.work_ns} calls={self.engine.calls}"
        return info


def main(argv: list[str] | None = None) -> None:
    role, hidden, *rest = sys.argv[1:] if argv is None else argv
    layers = tuple(int(x) for x in rest[0].split(",")) if rest and rest[0] else ()
    from bench.zero_cost_engines import ZeroCostDraft, ZeroCostTarget

    async def load(cls, settings, role):
        if role == "target":
            engine = ZeroCostTarget(int(hidden))
        else:
            engine = ZeroCostDraft(int(hidden), FeatureSpec(layers, "float16") if layers else None)
        return _StatsHost(engine, None, role, model_name="zero-cost")

    engine_host.EngineHost.load = classmethod(load)
    settings = ServiceSettings.from_env()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run_loop(serve(settings, role, freeze_gc=True))  # as services.model_main's own entry point


if __name__ == "__main__":
    main()
