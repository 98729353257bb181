"""Local process pool and Ray run the same tasks on the same code path and give the same results."""

from __future__ import annotations

import pytest

from memwarden.errors import InputError
from memwarden.resilience.campaign import run_campaign
from memwarden.resilience.executor import LocalExecutor, make_executor
from test_campaign import write_script_config


def square(spec: dict) -> dict:
    return {"x": spec["x"], "y": spec["x"] ** 2}


def _deterministic(data: dict) -> dict:
    # latencies and RSS are measurements; status, order and answers are not
    return {side: [(r["index"], r["status"], r["output_sha"]) for r in data["records"][side]] for side in ("a", "b")}


def test_local_and_ray_give_identical_results(tmp_path) -> None:
    pytest.importorskip("ray")
    a = write_script_config(tmp_path, "a", workers=2)
    b = write_script_config(tmp_path, "b", limit="4GiB")
    with make_executor("local", jobs=2) as local:
        local_run = run_campaign(a, b, runs=3, seed=3, executor=local).to_json(records=True)
    with make_executor("ray", jobs=2) as ray_executor:
        ray_run = run_campaign(a, b, runs=3, seed=3, executor=ray_executor).to_json(records=True)
    import ray

    assert not ray.is_initialized()  # the executor started it, so it shut it down
    assert _deterministic(local_run) == _deterministic(ray_run)
    assert local_run["executor"] == "local" and ray_run["executor"] == "ray"
    for key in ("requests", "ok", "oom", "crash", "lost"):
        assert local_run["a"][key] == ray_run["a"][key] and local_run["b"][key] == ray_run["b"][key]


def test_local_executor_keeps_spec_order_and_refuses_closures() -> None:
    with LocalExecutor(2) as ex:
        assert ex.map(square, [{"x": i} for i in range(5)]) == [{"x": i, "y": i * i} for i in range(5)]
    with LocalExecutor(1) as ex, pytest.raises(TypeError):
        ex.map(lambda spec: spec, [{}])


def test_bad_executor_kinds() -> None:
    with pytest.raises(InputError, match="unknown executor"):
        make_executor("spark")
    with pytest.raises(InputError, match="--ray-address needs --executor ray"):
        make_executor("local", address="127.0.0.1:6379")
