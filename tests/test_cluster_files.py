"""The cloud configurations in cluster/ are valid for the tools that read them and
secure by default: token authentication everywhere, no token in any file, the
dashboard on localhost unless a comment says why not, one Ray version throughout.

The launcher file goes through the checks `ray up` makes before it contacts the
cloud (Ray's own schema, ray/autoscaler/ray-schema.json). No package ships the
KubeRay CRDs' schemas, so KUBERAY below spells out the fields those CRDs require
(and the types of the ones used here), from KubeRay's ray.io/v1 API.
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement

from perfed_ray.sweep import spec

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "cluster"
RAY_VERSION = "2.60.0"  # of every image and manifest here

_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_REPLICAS = {"type": "integer", "minimum": 0}
_POD_TEMPLATE = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "required": ["containers"],
            "properties": {
                "containers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "image"],
                        "properties": {
                            "name": {"type": "string"},
                            "image": {"type": "string"},
                            "env": {"type": "array"},
                        },
                    },
                }
            },
        }
    },
}
_CLUSTER_SPEC = {
    "type": "object",
    "required": ["headGroupSpec"],
    "properties": {
        "rayVersion": {"type": "string"},
        "authOptions": {
            "type": "object",
            "required": ["mode"],
            "properties": {"mode": {"enum": ["disabled", "token"]}},
        },
        "enableInTreeAutoscaling": {"type": "boolean"},
        "autoscalerOptions": {
            "type": "object",
            "properties": {"idleTimeoutSeconds": {"type": "integer"}},
        },
        "headGroupSpec": {
            "type": "object",
            "required": ["template"],
            "properties": {"rayStartParams": _STRINGS, "template": _POD_TEMPLATE},
        },
        "workerGroupSpecs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["groupName", "template"],
                "properties": {
                    "groupName": {"type": "string"},
                    "replicas": _REPLICAS,
                    "minReplicas": _REPLICAS,
                    "maxReplicas": _REPLICAS,
                    "rayStartParams": _STRINGS,
                    "template": _POD_TEMPLATE,
                },
            },
        },
    },
}
_METADATA = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
KUBERAY = {
    "RayCluster": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "ray.io/v1"},
            "metadata": _METADATA,
            "spec": _CLUSTER_SPEC,
        },
    },
    "RayJob": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "ray.io/v1"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["entrypoint", "rayClusterSpec"],
                "properties": {
                    "entrypoint": {"type": "string"},
                    "shutdownAfterJobFinishes": {"type": "boolean"},
                    "ttlSecondsAfterFinished": {"type": "integer"},
                    "activeDeadlineSeconds": {"type": "integer"},
                    "rayClusterSpec": _CLUSTER_SPEC,
                },
            },
        },
    },
}
MANIFESTS = sorted((CLUSTER / "kuberay").glob("*.yaml"))


def _manifest(path: Path) -> dict:
    (doc,) = list(yaml.safe_load_all(path.read_text()))
    return doc


def _cluster_spec(doc: dict) -> dict:
    return doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]


def test_launcher_config_passes_ray_ups_own_checks():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((CLUSTER / "aws.yaml").read_text())
    validate_config(prepare_config(copy.deepcopy(config)))
    broken = {**config, "head_node_typ": config["head_node_type"]}  # a misspelt field
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(broken))


def test_launcher_config_is_secure_by_default():
    config = yaml.safe_load((CLUSTER / "aws.yaml").read_text())
    starts = config["head_start_ray_commands"] + config["worker_start_ray_commands"]
    for command in (c for c in starts if "ray start" in c):
        assert "RAY_AUTH_MODE=token ray start" in command
    assert "--dashboard-host=127.0.0.1" in config["head_start_ray_commands"][-1]
    # The token travels from the user's own file, never from this one.
    assert config["file_mounts"]["/home/ray/.ray/auth_token"] == "~/.ray/auth_token"
    assert config["docker"]["image"].startswith(f"rayproject/ray:{RAY_VERSION}-")


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_kuberay_manifests_have_the_fields_kuberay_requires(path):
    doc = _manifest(path)
    jsonschema.validate(doc, KUBERAY[doc["kind"]])
    spec = _cluster_spec(doc)
    assert spec["rayVersion"] == RAY_VERSION
    for group in spec.get("workerGroupSpecs", []):
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    gpu = groups["gpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert gpu["nvidia.com/gpu"] == "1"
    # The head runs the driver only, so `auto` actor resources count the workers' CPUs.
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"


def test_kuberay_manifests_check_themselves_against_a_broken_copy():
    doc = _manifest(CLUSTER / "kuberay" / "raycluster.yaml")
    doc["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0  # KubeRay wants strings
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, KUBERAY["RayCluster"])


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_kuberay_manifests_are_secure_by_default(path):
    doc = _manifest(path)
    spec = _cluster_spec(doc)
    assert spec["authOptions"]["mode"] == "token"
    text = path.read_text()
    if doc["kind"] == "RayCluster":
        assert spec["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    else:  # the operator must reach the job's dashboard: the file must say so
        assert "dashboard-host" not in spec["headGroupSpec"]["rayStartParams"]
        assert "operator submits the job and follows it through the dashboard" in text


def test_no_token_is_written_in_any_cluster_file():
    for path in CLUSTER.rglob("*"):
        if path.is_file():
            text = path.read_text()
            # Only placeholders ("<...>") and references ($...) may follow the name.
            assert not re.search(r"RAY_AUTH_TOKEN=(?![\"']?[<$])\S", text), path
            assert not re.search(r"\b[0-9a-f]{32,}\b", text), path


def test_every_image_and_the_package_agree_on_ray():
    images = [
        c["image"] for doc in map(_manifest, MANIFESTS) for c in _containers(_cluster_spec(doc))
    ]
    assert set(images) == {"perfed-ray:0.1.0"}
    assert f"FROM rayproject/ray:{RAY_VERSION}-" in (CLUSTER / "Dockerfile").read_text()
    pins = re.findall(r'^\s*"(ray\[?[^"]*)",', (REPO / "pyproject.toml").read_text(), re.M)
    ray = Requirement(pins[0])
    assert ray.specifier.contains(RAY_VERSION) and not ray.specifier.contains("2.51.0")


def _containers(spec: dict) -> list[dict]:
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_the_rayjob_runs_the_table1_sweep_as_the_cluster_can_hold_it():
    doc = _manifest(CLUSTER / "kuberay" / "rayjob-table1.yaml")
    words = shlex.split(doc["spec"]["entrypoint"])
    assert words[:2] == ["perfed-ray", "sweep"]
    path = Path(words[2].replace("/home/ray/perfed-ray", str(REPO)))
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    resources = [words[i + 1] for i, w in enumerate(words) if w == "--resources"]
    sweep = spec.load(path, sets, resources)
    assert len(sweep.trials) == 90 and {t.dataset for t in sweep.trials} == {"mnist", "cifar10"}
    for cfg in sweep.trials:
        assert (cfg.data_root, cfg.data_transport, cfg.users_per_actor) == (
            "/home/ray/data",
            "data_root",
            None,
        )
    # The trials' drivers run on the head, which declares no CPUs; their actors fit the
    # GPU workers, one CPU and a GPU share each.
    cluster = _cluster_spec(doc)
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert sweep.resources.driver_cpus == 0
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]
    per_worker = min(int(worker["limits"]["cpu"]) / sweep.resources.cpus, 1 / sweep.resources.gpus)
    assert per_worker == 4  # trials side by side on each GPU worker
    assert "CIFAR-10" in (CLUSTER / "Dockerfile").read_text()  # the image holds both data sets
