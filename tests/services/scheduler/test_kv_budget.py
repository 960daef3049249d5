"""The scheduler's token budget follows the target's KV cache, so admission, not the cache, is what runs out."""

from scheduler.engine_loop import SchedulerConfig
from services.scheduler.main import kv_token_budget
from shared.rpc.gen.tandem.v1 import common_pb2


def test_budget_is_the_cache_minus_per_request_slack():
    info = common_pb2.ServiceInfo(kv_blocks_total=1000, block_size=16)
    config = SchedulerConfig(max_batch_size=8, max_tokens_in_flight=1 << 20)
    assert kv_token_budget(info, config, max_spec_k=4) == 16_000 - 8 * (16 + 4)


def test_configured_budget_wins_when_smaller_or_cache_unknown():
    config = SchedulerConfig(max_tokens_in_flight=500)
    assert kv_token_budget(common_pb2.ServiceInfo(kv_blocks_total=1000, block_size=16), config) == 500
    assert kv_token_budget(common_pb2.ServiceInfo(), config) == 500
