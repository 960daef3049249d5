"""The generated code builds, imports and is documented field by field."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import shared.rpc
from shared.rpc import _protoc
from shared.rpc.gen.tandem.v1 import (
    common_pb2,
    draft_pb2,
    draft_pb2_grpc,
    tandem_pb2,
    tandem_pb2_grpc,
    target_pb2,
    target_pb2_grpc,
)

PROTO_DIR = _protoc.PROTO_DIR
PROTOS = sorted(PROTO_DIR.rglob("*.proto"))
MODULES = {"common": common_pb2, "draft": draft_pb2, "target": target_pb2, "tandem": tandem_pb2}


def test_protos_present_and_generated_code_importable() -> None:
    assert [p.name for p in PROTOS] == ["common.proto", "draft.proto", "tandem.proto", "target.proto"]
    assert shared.rpc.ensure_built() == _protoc.GEN_DIR
    assert _protoc.is_up_to_date()
    for module in MODULES.values():
        assert module.DESCRIPTOR.package == "tandem.v1"
        assert module.__name__.startswith("shared.rpc.gen.tandem.v1.")
    # descriptors are registered under their canonical proto path (what -I protos gives)
    assert draft_pb2.DESCRIPTOR.name == "tandem/v1/draft.proto"
    assert [d.name for d in draft_pb2.DESCRIPTOR.dependencies] == ["tandem/v1/common.proto"]
    # message classes live where pickle will look for them
    assert tandem_pb2.GenerateRequest.__module__ == "shared.rpc.gen.tandem.v1.tandem_pb2"
    assert draft_pb2_grpc.DraftServiceStub and target_pb2_grpc.TargetServiceStub and tandem_pb2_grpc.TandemStub


def test_services_and_methods() -> None:
    def methods(module, service: str) -> dict[str, tuple[str, bool]]:
        desc = module.DESCRIPTOR.services_by_name[service]
        return {m.name: (m.output_type.name, m.server_streaming) for m in desc.methods}

    assert set(methods(draft_pb2, "DraftService")) == {"Prefill", "Speculate", "Release", "Offload", "Reload", "Info",
                                                          "SpeculateStream", "PushFeatures", "Relay"}
    assert set(methods(target_pb2, "TargetService")) == {"Prefill", "Verify", "Step", "Release", "ResizeKV", "Info", "Features",
                                                            "StepStream"}
    tandem = methods(tandem_pb2, "Tandem")
    assert tandem["Generate"] == ("GenerateResponse", True)
    assert tandem["GenerateUnary"] == ("GenerateResult", False)
    assert set(tandem) == {"Generate", "GenerateUnary", "Abort", "Info"}


def test_enum_values_are_prefixed_and_zero_is_unspecified() -> None:
    for module in MODULES.values():
        for enum in module.DESCRIPTOR.enum_types_by_name.values():
            prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"
            assert enum.values[0].name == prefix + "UNSPECIFIED" and enum.values[0].number == 0
            assert all(v.name.startswith(prefix) for v in enum.values), enum.name


def test_every_response_carries_timing() -> None:
    for module in MODULES.values():
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                out = method.output_type
                if out.full_name.startswith("tandem.v1.") and out.name not in {"ServiceInfo", "TandemInfo"}:
                    has = "timing" in out.fields_by_name or any(
                        f.message_type is not None and "timing" in f.message_type.fields_by_name for f in out.fields
                    )
                    assert has, f"{service.name}.{method.name} -> {out.name} has no timing"


# --- documentation: a `///` comment right above every declaration --------------------------------

_DECL = re.compile(
    r"^\s*(?:"
    r"(?P<block>message|enum|service|oneof)\s+\w+\s*\{"
    r"|rpc\s+\w+\s*\("
    r"|(?:optional\s+|repeated\s+)?(?:map<[^>]+>|[\w.]+)\s+(?P<field>\w+)\s*=\s*\d+\s*;"
    r"|(?P<value>[A-Z][A-Z0-9_]*)\s*=\s*\d+\s*;"
    r")"
)


def _undocumented(text: str) -> tuple[list[str], int, int]:
    missing, num_fields, num_values = [], 0, 0
    prev = ""
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        m = _DECL.match(line)
        if m:
            num_fields += m.group("field") is not None
            num_values += m.group("value") is not None
            if not (prev.startswith("///") and len(prev) > 4):
                missing.append(f"{lineno}: {stripped}")
        prev = stripped
    return missing, num_fields, num_values


@pytest.mark.parametrize("path", PROTOS, ids=lambda p: p.name)
def test_every_declaration_has_a_doc_comment(path: Path) -> None:
    missing, num_fields, num_values = _undocumented(path.read_text())
    assert not missing, f"{path.name}: undocumented:\n" + "\n".join(missing)
    # the parser saw every field and enum value the compiler saw
    desc = MODULES[path.stem].DESCRIPTOR
    assert num_fields == sum(len(m.fields) for m in desc.message_types_by_name.values())
    assert num_values == sum(len(e.values) for e in desc.enum_types_by_name.values())


def test_doc_check_catches_a_missing_comment() -> None:
    text = "/// A.\nmessage A {\n  /// x.\n  int32 x = 1;\n  int32 y = 2;\n}\n"
    missing, num_fields, _ = _undocumented(text)
    assert missing == ["5: int32 y = 2;"] and num_fields == 2


# --- the build itself ---------------------------------------------------------------------------


def test_build_skips_when_up_to_date_and_rebuilds_on_change(tmp_path: Path) -> None:
    protos, gen = tmp_path / "protos", tmp_path / "gen"
    shutil.copytree(PROTO_DIR, protos)
    assert _protoc.build(proto_dir=protos, gen_dir=gen) is True
    assert (gen / "tandem" / "v1" / "draft_pb2_grpc.py").exists() and (gen / "__init__.py").exists()
    assert "from shared.rpc.gen.tandem.v1 import common_pb2" in (gen / "tandem" / "v1" / "draft_pb2.py").read_text()
    assert _protoc.build(proto_dir=protos, gen_dir=gen) is False  # up to date
    common = protos / "tandem" / "v1" / "common.proto"
    common.write_text(common.read_text() + "\n/// Added.\nmessage Added {}\n")
    assert not _protoc.is_up_to_date(protos, gen)
    assert _protoc.build(proto_dir=protos, gen_dir=gen) is True
    assert "_ADDED" in (gen / "tandem" / "v1" / "common_pb2.py").read_text()
    assert not list(gen.glob(".build-*")) and not list(gen.glob(".old-*"))


def test_build_reports_protoc_errors(tmp_path: Path) -> None:
    protos = tmp_path / "protos"
    shutil.copytree(PROTO_DIR, protos)
    (protos / "tandem" / "v1" / "broken.proto").write_text('syntax = "proto3";\nmessage B { nonsense }\n')
    with pytest.raises(_protoc.ProtoBuildError, match="broken.proto"):
        _protoc.build(proto_dir=protos, gen_dir=tmp_path / "gen")
    with pytest.raises(_protoc.ProtoBuildError, match="no protos"):
        _protoc.build(proto_dir=tmp_path / "missing", gen_dir=tmp_path / "gen2")
