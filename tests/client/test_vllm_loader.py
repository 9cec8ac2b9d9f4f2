"""The vLLM model-loader plugin (tensor_registry/vllm/plugin.py) against a real
`tensor-registry serve`.

vLLM is not installable here, so each test runs a stand-in vLLM worker process
(harness/vllm_standin.py: vLLM's plugin, loader-registry and base-loader interface) that finds
the plugin through the `vllm.general_plugins` entry point declared in client/pyproject.toml,
builds a small model and asks
`get_model_loader(LoadConfig(load_format="tensor-registry", ...))` to load it. Checked:
bit-exact weights for hf (through the model's load_weights, which fuses and shards) and vllm
format (copied in place, each tensor-parallel rank its own file), the token from the
environment or the login file and never from the (logged) extra config, and the
command `vllm-args --loader tensor-registry` prints."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.artifacts import make_artifact
from harness.serve_process import ROOT
from harness.vllm_standin import write_standin
from tensor_registry import RegistryClient
from tensor_registry.node_cache import NodeCache
from tests.client.conftest import Registry
from tests.client.test_light_install import BLOCKED

HIDDEN, VOCAB = 16, 32
MARKER = ".vllm_tensorized_marker"


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> str:
    """PYTHONPATH for a stand-in vLLM process: the stand-in package, and a dist-info carrying
    the entry points the library's client/pyproject.toml declares (what `pip install` would
    write)."""
    root = tmp_path_factory.mktemp("standin-vllm")
    write_standin(root / "pkg")
    project = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())
    plugins = project["project"]["entry-points"]["vllm.general_plugins"]
    dist = root / "site" / "tensor_registry_standin-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensor-registry-standin\n")
    lines = "".join(f"{name} = {target}\n" for name, target in plugins.items())
    (dist / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{lines}")
    return f"{root / 'pkg'}:{root / 'site'}:{ROOT}"


def _model_dir(tmp_path: Path, dtype: str) -> Path:
    directory = tmp_path / "model"
    directory.mkdir(exist_ok=True)
    config = {
        "architectures": ["ToyForCausalLM"],
        "hidden_size": HIDDEN,
        "vocab_size": VOCAB,
        "torch_dtype": dtype,
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _hf_state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state = {
        f"{p}_proj.weight": torch.randn(HIDDEN, HIDDEN, generator=g) for p in ("q", "k", "v", "o")
    }
    return {
        "embed.weight": torch.randn(VOCAB, HIDDEN, generator=g),
        **state,
        "norm": torch.randn(HIDDEN, generator=g),
        "position_ids": torch.arange(8),
    }


def _vllm_rank_state(hf: dict[str, torch.Tensor], rank: int, tp: int) -> dict[str, torch.Tensor]:
    """What vLLM's model holds on ``rank``: q/k/v sharded by rows and fused, o by columns."""
    qkv = torch.cat([hf[f"{p}_proj.weight"].chunk(tp, dim=0)[rank] for p in ("q", "k", "v")])
    return {
        "embed.weight": hf["embed.weight"],
        "qkv_proj.weight": qkv,
        "o_proj.weight": hf["o_proj.weight"].chunk(tp, dim=1)[rank],
        "norm": hf["norm"],
        "position_ids": hf["position_ids"],
    }


async def _publish(registry: Registry, **kwargs: Any) -> str:
    name = f"acme/vl-{uuid.uuid4().hex[:10]}"
    registry.ready_model(name)
    await make_artifact(registry.settings, model=name, version=1, layout=True, **kwargs)
    return name


def _worker(
    registry: Registry,
    standin: str,
    tmp_path: Path,
    extra: Any,
    *,
    rank: int = 0,
    tp: int = 1,
    dtype: str = "float32",
    env: dict[str, str | None] | None = None,
    download: bool = False,
    quantization: str | None = None,
    download_only: bool = False,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    out = tmp_path / f"rank{rank}-of-{tp}.pt"
    spec = tmp_path / f"spec-{rank}-{tp}.json"
    spec.write_text(
        json.dumps(
            {
                "model_dir": str(_model_dir(tmp_path, dtype)),
                "load_format": "tensor-registry",
                "extra": extra,
                "out": str(out),
                "download": download,
                "quantization": quantization,
                "download_only": download_only,
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "vllm.standin_worker", str(spec)],
        env=registry.cli_env(
            env={
                "PYTHONPATH": standin,
                "STANDIN_TP_RANK": str(rank),
                "STANDIN_TP_SIZE": str(tp),
                "TENSOR_REGISTRY_CACHE_DIR": str(tmp_path / "cache"),
                **(env or {}),
            }
        ),
        capture_output=True,
        text=True,
        timeout=180,
    )
    if done.returncode != 0 or download_only:
        return done, None
    return done, torch.load(out, weights_only=True)


def _bit_exact(loaded: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(loaded) == set(expected)
    for name, tensor in expected.items():
        assert loaded[name].dtype == tensor.dtype, name
        got = loaded[name].contiguous().reshape(-1).view(torch.uint8)
        assert torch.equal(got, tensor.contiguous().reshape(-1).view(torch.uint8)), name


async def test_hf_artifact_goes_through_the_models_load_weights(
    registry: Registry, standin: str, tmp_path: Path
) -> None:
    hf = _hf_state(1)
    name = await _publish(registry, sources=[hf], format="hf")
    for rank, tp in ((0, 1), (1, 2)):  # a 2-way vLLM: every rank reads the one hf file
        done, loaded = _worker(registry, standin, tmp_path, {"model": name}, rank=rank, tp=tp)
        assert done.returncode == 0, done.stderr
        assert loaded is not None
        assert loaded["loader"] == "TensorRegistryLoader" and loaded["processed"]
        assert loaded["in_place"]
        _bit_exact(loaded["state"], _vllm_rank_state(hf, rank, tp))
        summary = json.loads(done.stderr.split("tensor-registry: loaded ", 1)[1].splitlines()[0])
        assert (summary["format"], summary["path"], summary["verified"]) == ("hf", "engine", True)
        assert registry.token not in done.stderr + done.stdout


async def test_an_encrypted_artifact_loads_through_tensorizers_reader_and_says_so(
    registry: Registry, standin: str, tmp_path: Path
) -> None:
    hf = _hf_state(7)
    name = await _publish(registry, sources=[hf], format="hf", encrypted=True)
    done, loaded = _worker(registry, standin, tmp_path, {"model": name})
    assert done.returncode == 0, done.stderr
    assert loaded is not None
    _bit_exact(loaded["state"], _vllm_rank_state(hf, 0, 1))
    summary = json.loads(done.stderr.split("tensor-registry: loaded ", 1)[1].splitlines()[0])
    assert summary["path"] == "tensorizer" and "encrypted" in summary["reason"]
    # The stand-in logs the root logger at INFO, as some deployments do: httpx then logs each
    # request's URL, the signed key URL's among them; the plugin cuts the signatures off.
    assert "HTTP Request: GET" in done.stderr and "/api/v1/keys/" in done.stderr
    assert "sig=" not in done.stderr and "exp=" not in done.stderr
    # Without keys:read the key is not handed out: refused, nothing loaded.
    reader = registry.token_with("resolve", "models:read", name="no-keys")
    done, _ = _worker(
        registry, standin, tmp_path, {"model": name}, env={"TENSOR_REGISTRY_TOKEN": reader}
    )
    assert done.returncode != 0 and reader not in done.stderr


async def test_vllm_artifact_is_copied_in_place_each_rank_its_file(
    registry: Registry, standin: str, tmp_path: Path
) -> None:
    hf = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in _hf_state(2).items()}
    ranks = [_vllm_rank_state(hf, rank, 2) for rank in range(2)]
    marker = {MARKER: torch.zeros(0)}
    name = await _publish(
        registry,
        sources=[{**state, **marker} for state in ranks],
        format="vllm",
        tensor_parallel_size=2,
        dtype="bfloat16",
    )
    # download_model in a process without a tensor-parallel group: every rank file cached.
    done, _ = _worker(
        registry,
        standin,
        tmp_path,
        {"model": name},
        dtype="bfloat16",
        env={"STANDIN_TP_SIZE": "none"},
        download=True,
        download_only=True,
    )
    assert done.returncode == 0, done.stderr
    cache = NodeCache(tmp_path / "cache")
    with RegistryClient(registry.url, registry.token) as client:
        files = [f for f in client.resolve(name).files if f.kind == "weights"]
    assert len(files) == 2 and all(cache.contains(f.sha256, f.size) for f in files)
    for rank in range(2):
        done, loaded = _worker(
            registry, standin, tmp_path, {"model": f"{name}:1"}, rank=rank, tp=2, dtype="bfloat16"
        )
        assert done.returncode == 0, done.stderr
        assert loaded is not None and loaded["in_place"]
        _bit_exact(loaded["state"], ranks[rank])
        assert f'"rank": {rank}' in done.stderr and '"format": "vllm"' in done.stderr
    # A 1-way vLLM has no matching vllm artifact and no hf one: refused, nothing loaded.
    done, _ = _worker(registry, standin, tmp_path, {"model": name, "format": "vllm"}, tp=1)
    assert done.returncode != 0 and "no_matching_artifact" in done.stderr


def _node(registry: Registry, node_id: str) -> dict[str, Any] | None:
    with registry.http() as http:
        items = http.get("/api/v1/nodes", params={"include_stale": "true", "limit": 500})
        return next((n for n in items.json()["items"] if n["id"] == node_id), None)


async def test_each_rank_checks_in_its_load_and_a_failure_with_its_reason(
    registry: Registry, standin: str, tmp_path: Path
) -> None:
    """The plugin checks in each rank's load (same node id as the agent, load and pull of the
    node), a failed one with its reason (vLLM still fails); "checkin": false sends nothing."""
    hf = _hf_state(11)
    name = await _publish(registry, sources=[hf], format="hf")
    node_id = f"vllm-{uuid.uuid4().hex[:8]}"
    env = {"TENSOR_REGISTRY_NODE_ID": node_id}
    for rank in range(2):
        done, _ = _worker(
            registry, standin, tmp_path, {"model": f"{name}:1"}, rank=rank, tp=2, env=env
        )
        assert done.returncode == 0, done.stderr
        assert "check-in" not in done.stderr
    node = _node(registry, node_id)
    assert node is not None
    with RegistryClient(registry.url, registry.token) as client:
        artifact = client.resolve(name).artifact_id
    assert sorted((x["by"], x["rank"], x["artifact_id"], x["path"]) for x in node["loaded"]) == [
        ("vllm", 0, artifact, "engine"),
        ("vllm", 1, artifact, "engine"),
    ]
    assert all(x["verified"] and x["seconds"] > 0 and x["ref"] == "1" for x in node["loaded"])

    done, _ = _worker(
        registry, standin, tmp_path, {"model": f"{name}:1", "format": "vllm"}, env=env
    )
    assert done.returncode != 0 and "no_matching_artifact" in done.stderr
    node = _node(registry, node_id)
    assert node is not None
    failed = node["loaded"][0]
    assert failed["artifact_id"] is None and "no_matching_artifact" in failed["error"]

    quiet = f"vllm-quiet-{uuid.uuid4().hex[:8]}"
    done, _ = _worker(
        registry,
        standin,
        tmp_path,
        {"model": name, "checkin": False},
        env={"TENSOR_REGISTRY_NODE_ID": quiet},
    )
    assert done.returncode == 0, done.stderr
    assert _node(registry, quiet) is None


async def test_a_vllm_artifact_of_another_shape_is_refused_by_name(
    registry: Registry, standin: str, tmp_path: Path
) -> None:
    hf = _hf_state(5)
    renamed = {
        ("attn." + k if k == "qkv_proj.weight" else k): v
        for k, v in _vllm_rank_state(hf, 0, 1).items()
    }
    name = await _publish(registry, sources=[{**renamed, MARKER: torch.zeros(0)}], format="vllm")
    done, _ = _worker(registry, standin, tmp_path, {"model": name})
    assert done.returncode != 0 and "tensors_mismatch" in done.stderr
    assert "qkv_proj.weight" in done.stderr
    # Serialized for a 2-way vLLM (half the rows) but loaded by a 1-way one: shapes differ.
    halves = {**_vllm_rank_state(hf, 0, 2), MARKER: torch.zeros(0)}
    other = await _publish(registry, sources=[halves], format="vllm")
    done, _ = _worker(registry, standin, tmp_path, {"model": other})
    assert done.returncode != 0 and "tensors_mismatch" in done.stderr and "shape" in done.stderr
    # Quantized models' vllm-format files hold post-processed weights: not this loader's.
    good = await _publish(registry, sources=[{**_vllm_rank_state(hf, 0, 1)}], format="vllm")
    done, _ = _worker(registry, standin, tmp_path, {"model": good}, quantization="fp8")
    assert done.returncode != 0 and "unsupported_artifact" in done.stderr
    done, loaded = _worker(registry, standin, tmp_path, {"model": good})
    assert done.returncode == 0, done.stderr
    assert loaded is not None
    _bit_exact(loaded["state"], _vllm_rank_state(hf, 0, 1))


async def test_the_token_comes_from_the_environment_or_login_never_the_extra_config(
    registry: Registry, standin: str, tmp_path: Path
) -> None:
    hf = _hf_state(3)
    name = await _publish(registry, sources=[hf], format="hf")
    refused, _ = _worker(
        registry, standin, tmp_path, {"model": name, "token": "trg_never-in-a-config"}
    )
    assert refused.returncode != 0
    assert "invalid_loader_config" in refused.stderr and "TENSOR_REGISTRY_TOKEN" in refused.stderr
    with_userinfo, _ = _worker(
        registry, standin, tmp_path, {"model": name, "url": "http://me:pw@127.0.0.1:9/"}
    )
    assert with_userinfo.returncode != 0 and "invalid_loader_config" in with_userinfo.stderr
    unknown, _ = _worker(registry, standin, tmp_path, {"model": name, "num_readers": 4})
    assert unknown.returncode != 0 and "unknown --model-loader-extra-config" in unknown.stderr

    # No token anywhere: the registry says so.
    anonymous, _ = _worker(
        registry,
        standin,
        tmp_path,
        {"model": name},
        env={"TENSOR_REGISTRY_TOKEN": None, "XDG_CONFIG_HOME": str(tmp_path / "no-login")},
    )
    assert anonymous.returncode != 0 and "missing_token" in anonymous.stderr
    # The login file's token (and URL), when the environment has none.
    home = tmp_path / "xdg"
    (home / "tensor-registry").mkdir(parents=True)
    (home / "tensor-registry" / "config.json").write_text(
        json.dumps({"url": registry.url, "token": registry.token})
    )
    done, loaded = _worker(
        registry,
        standin,
        tmp_path,
        {"model": name},
        env={
            "TENSOR_REGISTRY_TOKEN": None,
            "TENSOR_REGISTRY_URL": None,
            "XDG_CONFIG_HOME": str(home),
        },
    )
    assert done.returncode == 0, done.stderr
    assert loaded is not None
    _bit_exact(loaded["state"], _vllm_rank_state(hf, 0, 1))
    assert registry.token not in done.stderr + done.stdout


async def test_vllm_args_loader_prints_the_plugin_command(
    registry: Registry, standin: str, tmp_path: Path
) -> None:
    hf = _hf_state(4)
    name = await _publish(registry, sources=[hf], format="hf")
    printed = registry.cli("vllm-args", name, "--loader", "tensor-registry")
    assert printed.returncode == 0, printed.stderr
    args = shlex.split(printed.stdout)
    assert args[:2] == ["--load-format", "tensor-registry"]
    extra = json.loads(args[args.index("--model-loader-extra-config") + 1])
    # Pinned to the version and variant, so every rank resolves the same artifact; no secret.
    assert extra == {"model": f"{name}:1", "dtype": "float32", "format": "hf"}
    assert args[args.index("--dtype") + 1] == "float32"
    assert registry.token not in printed.stdout
    # What it printed loads (download_model first fills the node cache).
    done, loaded = _worker(registry, standin, tmp_path, extra, download=True)
    assert done.returncode == 0, done.stderr
    assert loaded is not None
    _bit_exact(loaded["state"], _vllm_rank_state(hf, 0, 1))
    assert '"source": "file"' in done.stderr  # the engine read the node cache's copy


async def test_pull_loader_prints_the_serve_command_for_the_plugin(
    registry: Registry, standin: str, tmp_path: Path
) -> None:
    hf = _hf_state(6)
    name = await _publish(registry, sources=[hf], format="hf")
    dest = tmp_path / "pulled"
    env = {"TENSOR_REGISTRY_CACHE_DIR": str(tmp_path / "cache")}
    pulled = registry.cli(
        "pull", name, "--dest", str(dest), "--weights", "--loader", "tensor-registry", env=env
    )
    assert pulled.returncode == 0, pulled.stderr
    command = shlex.split(pulled.stdout)
    assert command[:5] == ["vllm", "serve", str(dest.resolve()), "--load-format", "tensor-registry"]
    extra = json.loads(command[command.index("--model-loader-extra-config") + 1])
    assert extra == {"model": f"{name}:1", "dtype": "float32", "format": "hf"}
    # The weights pulled into the node cache are what the plugin then reads.
    done, loaded = _worker(registry, standin, tmp_path, extra)
    assert done.returncode == 0, done.stderr
    assert loaded is not None and '"source": "file"' in done.stderr
    _bit_exact(loaded["state"], _vllm_rank_state(hf, 0, 1))


def test_the_plugin_module_needs_neither_vllm_nor_torch_until_vllm_calls_it() -> None:
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys
        BLOCKED = {[*BLOCKED, "vllm"]!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"{{name}} is not installed on this node")
                return None

        sys.meta_path.insert(0, Block())
        from tensor_registry.vllm import plugin as vllm_loader
        options = vllm_loader.parse_extra_config('{{"model": "acme/llama:prod"}}')
        assert (options.model, options.ref, options.verify) == ("acme/llama", "prod", True)
        try:
            vllm_loader.register()
        except ImportError as exc:
            assert "vllm" in str(exc)
        else:
            raise AssertionError("registered without vLLM")
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        assert not leaked, leaked
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
