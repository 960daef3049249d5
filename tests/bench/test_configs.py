"""Configuration names and the order rotation of repeats."""

import pytest

from bench.configs import StackKey, parse, parse_list, rotated


def test_names_map_to_engines_and_speculation():
    assert parse("target-only").speculation == "off" and not parse("target-only").speculates
    k3 = parse("tandem-k3")
    assert (k3.engine, k3.speculation, k3.stack) == ("tandem", 3, StackKey())
    assert parse("hf-assisted").engine == "hf" and parse("hf-assisted").hf_options == {}
    assert parse("hf-assisted-heuristic").hf_options["num_assistant_tokens_schedule"] == "heuristic"
    pol = parse("policy:fixed:2")
    assert pol.speculation == "auto" and pol.stack == StackKey("fixed:2")


def test_per_request_configurations_share_a_stack_and_policies_do_not():
    keys = {c.stack for c in parse_list("target-only,tandem-k1,tandem-k5")}
    assert len(keys) == 1
    assert parse("policy:none").stack not in keys


@pytest.mark.parametrize("bad", ["tandem-k0", "tandem", "policy:", "vllm"])
def test_unknown_names_fail(bad):
    with pytest.raises(ValueError):
        parse(bad)


def test_listing_a_configuration_twice_fails():
    with pytest.raises(ValueError):
        parse_list("tandem-k3,tandem-k3")


def test_rotation_starts_each_repeat_elsewhere():
    cs = parse_list("target-only,tandem-k1,tandem-k3")
    orders = [[c.name for c in rotated(cs, s)] for s in range(3)]
    assert orders[1] == ["tandem-k1", "tandem-k3", "target-only"]
    assert [o[0] for o in orders] == [c.name for c in cs]  # every configuration goes first once
    assert rotated(cs, 3) == cs and rotated([], 1) == []


def test_protocol_configurations_name_the_stacks_worker_protocol():
    unary, plain, stream = (parse(n) for n in ("protocol:unary:k3", "protocol:unary:k0", "protocol:stream:k3"))
    assert unary.speculation == 3 and plain.speculation == "off" and stream.speculation == 3
    assert unary.stack == plain.stack and unary.stack.worker_protocol == "unary"  # one stack per protocol
    assert stream.stack != unary.stack and stream.stack.worker_protocol == "stream"
    for bad in ("protocol:grpc:k3", "protocol:stream", "protocol:stream:3"):
        with pytest.raises(ValueError):
            parse(bad)
