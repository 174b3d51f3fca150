"""The collector reads a well-formed agent report in one pass (msgspec's typed decoding) and
anything else field by field: whatever a report is, both must give the same `Report` (every
value, int or float as sent) or the same refusal naming the path of the bad value."""

from __future__ import annotations

import copy
import json
import random
from collections import OrderedDict

import pytest

from telemetry import payload as payload_module
from telemetry.agent.scenario import build_scenario
from telemetry.agent.server import AgentServer
from telemetry.agent.sim_backend import SimBackend
from telemetry.payload import PayloadError, parse_agent_payload
from telemetry.tests.test_payload_health import _NASTY, _outcome, agree


def sim_body(gpus: int = 8, vgpus_per_gpu: int = 4) -> bytes:
    """What the sim agent serves for a host of `gpus` L40S with `vgpus_per_gpu` L40S-8Q each:
    the collector's typical report (8 GPUs and 32 vGPUs with the health fields: ~24 KB)."""
    scenario = build_scenario("render-07", [
        {"name": "NVIDIA L40S", "fb_total_mib": 46068, "virtualization_mode": "vgpu_host", "power_limit_w": 350,
         "max_sm_clock_mhz": 2520,
         "vgpus": [{"vm_name": f"ws-{g}-{v}", "type_name": "L40S-8Q", "fb_mib": 8192} for v in range(vgpus_per_gpu)]}
        for g in range(gpus)])
    server = AgentServer(("127.0.0.1", 0), SimBackend(scenario), "token", "render-07")
    try:
        return server.metrics_body()
    finally:
        server.server_close()


@pytest.fixture(scope="module")
def body() -> bytes:
    return sim_body()


def test_the_sim_agents_report_is_read_in_one_pass_as_field_by_field(body):
    report = parse_agent_payload(body)

    assert payload_module._typed_payload(body) is not None
    assert repr(report) == repr(payload_module._checked_payload(body))
    assert (len(report.gpus), sum(len(gpu.vgpus) for gpu in report.gpus)) == (8, 32)
    assert all(gpu.health is not None and gpu.scheduler is not None for gpu in report.gpus)
    assert all(vgpu.health.license_state == "licensed" for gpu in report.gpus for vgpu in gpu.vgpus)
    assert report.driver.cuda_driver_version == 13000


def _places(node, path=()):
    """Every (path, container) below `node`: the objects and lists a mutation may change."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _places(value, (*path, key))
    elif isinstance(node, list):
        yield path, node
        for i, value in enumerate(node):
            yield from _places(value, (*path, i))


def _mutate(document: dict, rng: random.Random) -> str:
    """Change one thing somewhere in `document`, as a broken or newer agent might; say what."""
    path, container = rng.choice(list(_places(document)))
    if isinstance(container, list):
        if not container:
            container.append(rng.choice(_NASTY[:-1]))
            return f"{path}: one item added"
        i = rng.randrange(len(container))
        how = rng.choice(["duplicate", "drop", "nasty", "nest"])
        if how == "duplicate":
            container.append(copy.deepcopy(container[i]))
        elif how == "drop":
            del container[i]
        elif how == "nasty":
            container[i] = rng.choice(_NASTY[:-1])
        else:
            container[i] = [container[i]]
        return f"{path}[{i}]: {how}"
    key = rng.choice(list(container) or ["new"])
    value = container.get(key)
    how = rng.choice(["delete", "nasty", "null", "unknown key", "float", "int", "scale", "negate", "long", "wrap"])
    if how == "delete":
        container.pop(key, None)
    elif how == "nasty":
        container[key] = rng.choice(_NASTY[:-1])
    elif how == "null":
        container[key] = None
    elif how == "unknown key":
        container[f"x_{key}"] = rng.choice(_NASTY[:-1])
    elif how == "float" and type(value) is int:
        container[key] = float(value)
    elif how == "int" and type(value) is float:
        container[key] = int(value)
    elif how == "scale" and type(value) in (int, float):
        container[key] = value * rng.choice([3, 1000, 10**12])
    elif how == "negate" and type(value) in (int, float):
        container[key] = -value or -1
    elif how == "long" and type(value) is str:
        container[key] = value * rng.choice([2, 5, 50])
    elif how == "wrap":
        container[key] = [value]
    else:
        container[key] = rng.choice(_NASTY[:-1])
        how = "nasty"
    return f"{path}.{key}: {how}"


@pytest.mark.parametrize("seed", range(8))
def test_mutated_reports_are_read_or_refused_as_field_by_field(body, seed):
    rng = random.Random(seed)
    base = json.loads(body)
    one_pass = refused = 0
    for _ in range(200):
        document = copy.deepcopy(base)
        changes = [_mutate(document, rng) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
        try:
            one_pass += agree(document)
        except AssertionError as exc:
            raise AssertionError(f"{changes}: {exc}") from None
        refused += _outcome(parse_agent_payload, document).startswith("refused")
    assert one_pass > 10, "reports the one pass reads were compared"
    assert refused > 10, "refusals were compared"


def _edited(body: bytes, old: bytes, new: bytes) -> bytes:
    assert old in body
    return body.replace(old, new, 1)


@pytest.mark.parametrize("edit", [
    lambda b: b[:-1],  # cut short
    lambda b: b"\xef\xbb\xbf" + b,  # a byte order mark: the stdlib reads it
    lambda b: b.decode().encode("utf-16"),  # the stdlib reads UTF-16 too
    lambda b: b.decode(),  # text, not bytes
    lambda b: bytearray(b),
    lambda b: b"  \n" + b + b"\n",
    lambda b: _edited(b, b'"util_gpu":', b'"util_gpu":NaN,"util_gpu":'),  # a repeated key: the last one counts
    lambda b: _edited(b, b'"util_gpu":', b'"util_gpu":500,"util_gpu":'),
    lambda b: _edited(b, b'"util_gpu":', b'"util_gpu":NaN,"x":'),
    lambda b: _edited(b, b'"util_gpu":', b'"util_gpu":Infinity,"x":'),
    lambda b: _edited(b, b'"util_gpu":', b'"x":NaN,"util_gpu":'),  # NaN where nobody reads it
    lambda b: _edited(b, b'"util_gpu":', b'"x":1e400,"util_gpu":'),
    lambda b: _edited(b, b'"util_gpu":', b'"x":123456789012345678901234567890,"util_gpu":'),
    lambda b: _edited(b, b'"util_gpu":', b'"util_gpu":1e400,"x":'),
    lambda b: _edited(b, b'"util_gpu":', b'"util_gpu":1.0e1,"x":'),
    lambda b: _edited(b, b'"util_gpu":', b'"util_gpu":-0,"x":'),
    lambda b: _edited(b, b'"util_gpu":', b'"util_gpu":-0.0,"x":'),
    lambda b: _edited(b, b'"util_gpu":', b'"util_gpu":100.00000000000001,"x":'),
    lambda b: _edited(b, b'"util_gpu":', b'"util_gpu":100.000000000000001,"x":'),
    lambda b: _edited(b, b'"util_gpu":', b'"util_gpu":99.99999999999999999,"x":'),
    lambda b: _edited(b, b'"index":0', b'"index":18446744073709551615'),
    lambda b: _edited(b, b'"index":0', b'"index":18446744073709551616'),
    lambda b: _edited(b, b'"index":0', b'"index":1e0'),
    lambda b: _edited(b, b'"vm_name":"', b'"vm_name":"\\ud800'),  # a lone surrogate: the stdlib reads it
    lambda b: _edited(b, b'"vm_name":"', b'"vm_name":"\\u00e9\\ud83d\\ude00'),
    lambda b: _edited(b, b'"vm_name":"', b'"vm_name":"\xc3\xa9'),
    lambda b: _edited(b, b'"vm_name":"', b'"vm_name":"\xff'),  # not UTF-8
    lambda b: _edited(b, b'"hostname":"render-07"', b'"hostname":"' + "\U0001f600".encode() * 100 + b'"'),
    lambda b: _edited(b, b'"hostname":"render-07"', b'"hostname":"' + "\U0001f600".encode() * 101 + b'"'),
    lambda b: _edited(b, b'"collected_at":', b'"collected_at":99999999999,"x":'),
    lambda b: _edited(b, b'"collected_at":', b'"collected_at":1e11,"x":'),
    lambda b: _edited(b, b'"xid_events":[]', b'"xid_events":[{"code":79,"at":1780000000,"last_seen":true}]'),
    lambda b: _edited(b, b'"xid_events":[]', b'"xid_events":[' + b",".join([b'{"code":79,"at":1.5}'] * 1000) + b"]"),
    lambda b: _edited(b, b'"xid_events":[]', b'"xid_events":[' + b",".join([b'{"code":79,"at":1.5}'] * 1000)
                      + b',{"code":0}]'),  # beyond the first 1,000 events nothing is read
    lambda b: _edited(b, b'"unsupported":[]', b'"unsupported":[null]'),
    lambda b: _edited(b, b'"guest_info_state":"initialized",', b""),
    lambda b: _edited(b, b'"scheduler_write":', b'"scheduler_write":null,"x":') if b'"scheduler_write":' in b
    else _edited(b, b'"backend":', b'"scheduler_write":null,"backend":'),
])
def test_any_body_is_read_or_refused_as_field_by_field(body, edit):
    edited = edit(body)

    assert _outcome(parse_agent_payload, edited) == _outcome(payload_module._checked_payload, edited)


def test_a_vgpu_using_more_than_its_gpus_frame_buffer_is_refused_with_its_path(body):
    document = json.loads(body)
    document["gpus"][3]["vgpus"][2]["fb_used_mib"] = 46068.5

    with pytest.raises(PayloadError) as refused:
        parse_agent_payload(json.dumps(document))

    assert str(refused.value) == ("gpus[3].vgpus[2].fb_used_mib: expected a number of MiB 0..46068 or null, "
                                  "got 46068.5")
    assert agree(document) is False


@pytest.mark.parametrize("seed", range(3))
def test_numbers_are_read_to_the_same_float_or_int_as_field_by_field(body, seed):
    rng = random.Random(seed)
    document = json.loads(body)
    spellings = []
    for gpu in document["gpus"]:
        for key in ("power_w", "util_gpu", "temp_c", "sm_clock_mhz"):
            digits = "".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 25)))
            spellings.append(rng.choice([f"{rng.uniform(0, 99):.{rng.randrange(0, 25)}f}",
                                         f"{rng.uniform(0, 99):.{rng.randrange(1, 20)}e}", f"0.{digits}",
                                         f"{rng.randrange(100)}", f"{rng.randrange(1, 99)}E{rng.randrange(-330, 2)}",
                                         f"{rng.randrange(1, 99)}.{digits}e-1", "-0", "-0.0", "0e5", "1E+1"]))
            gpu[key] = "@number@"
    text = json.dumps(document, separators=(",", ":"))
    for spelling in spellings:
        text = text.replace('"@number@"', spelling, 1)

    report = parse_agent_payload(text.encode())

    assert payload_module._typed_payload(text.encode()) is not None
    assert repr(report) == repr(payload_module._checked_payload(text.encode()))


@pytest.mark.parametrize("data", [
    OrderedDict,  # not a JSON object's type
    lambda d: [d],
    lambda d: memoryview(json.dumps(d).encode()),
    lambda d: json.dumps(d).replace("render-07", "render-\ud800"),  # text no UTF-8 can carry
])
def test_other_inputs_are_read_or_refused_as_field_by_field(body, data):
    given = data(json.loads(body))

    assert ascii(_outcome(parse_agent_payload, given)) == ascii(_outcome(payload_module._checked_payload, given))


def test_each_wire_type_lists_the_fields_of_its_reading_in_order():
    """The one pass builds each reading from its wire values in order (`_gpu_from`)."""
    from telemetry.payload import VGPU_HEALTH_FIELDS, DriverInfo, GpuHealth, GpuReading, VgpuReading

    assert payload_module._GpuWire.__struct_fields__ == GpuReading.__slots__
    assert payload_module._VgpuWire.__struct_fields__ == VgpuReading.__slots__[:-1] + VGPU_HEALTH_FIELDS
    assert payload_module._GpuHealthWire.__struct_fields__ == GpuHealth.__slots__
    assert payload_module._DriverWire.__struct_fields__ == DriverInfo.__slots__
    assert payload_module._SchedulerWire.__struct_fields__ == payload_module._SCHEDULER_KEYS
