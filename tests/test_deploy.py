"""The manifests in deploy/ are well formed: the KubeRay RayJob runs a `temper train` Temper
accepts; the env-server and sandbox fleets validate against the Kubernetes API schemas
(offline, kubernetes-validate) and their Services, autoscalers and probes fit together."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from temper.config import load_config

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
RAYJOB = ROOT / "deploy" / "kuberay" / "rayjob.yaml"
# Keys the Ray backend adds to the schema (orchestrator.backend = "ray" and its options).
RAY_KEYS = {"backend", "ray_address", "ray_num_cpus", "ray_placement"}


def test_rayjob_runs_temper_train_on_a_ray_cluster():
    job = yaml.safe_load(RAYJOB.read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # the head's CPUs are the trainer's
    (worker_group,) = cluster["workerGroupSpecs"]
    assert worker_group["replicas"] >= 1
    for group in (head, worker_group):
        (container,) = group["template"]["spec"]["containers"]
        assert container["image"] and container["resources"]["limits"]["cpu"]
        assert "/dev/shm" in [m["mountPath"] for m in container["volumeMounts"]]

    argv = shlex.split(spec["entrypoint"])
    assert argv[:2] == ["temper", "train"]
    config, overrides = argv[2], argv[3:]
    assert (ROOT / config).is_file()  # the image's working directory is the repository's copy
    ray = {o.split("=", 1)[0].removeprefix("--orchestrator."): o for o in overrides if "ray" in o}
    assert set(ray) == RAY_KEYS
    assert ray["backend"] == "--orchestrator.backend=ray"
    assert ray["ray_address"] == "--orchestrator.ray_address=auto"
    # Everything else must already be a valid Temper config with these overrides.
    rest = [o for o in overrides if o not in ray.values()]
    cfg = load_config(ROOT / config, rest)
    assert cfg.orchestrator.rollout_workers == 4 and str(cfg.run.output_dir) == "/runs"
    # 4 actors of ray_num_cpus CPUs fit the worker pods' Ray CPUs exactly.
    cpus = float(ray["ray_num_cpus"].split("=", 1)[1])
    pods = worker_group["replicas"] * float(worker_group["rayStartParams"]["num-cpus"])
    assert cfg.orchestrator.rollout_workers * cpus == pods


# --- deploy/kubernetes/env-servers.yaml: env-server and sandbox fleets ---------------------

FLEET = ROOT / "deploy" / "kubernetes" / "env-servers.yaml"
# The oldest Kubernetes API the schemas of kubernetes-validate>=1.30 (the dev dependency)
# always include; the newest the installed copy ships is checked as well.
K8S_VERSION = "1.30"
KINDS = ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"]
FLEETS = {"temper-env-server": ("env-serve", 8100), "temper-sandbox": ("sandbox-serve", 8200)}


def _fleet_docs() -> list[dict]:
    return [d for d in yaml.safe_load_all(FLEET.read_text()) if d is not None]


def _by_kind_and_name() -> dict[tuple[str, str], dict]:
    docs = _fleet_docs()
    found = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(found) == len(docs)  # no two documents share a kind and a name
    return found


def _container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _argv(container: dict) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def test_fleet_documents_validate_strictly_against_the_kubernetes_api():
    import kubernetes_validate

    docs = _fleet_docs()
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted(
        (kind, name) for kind in KINDS for name in FLEETS
    )
    versions = {K8S_VERSION, kubernetes_validate.latest_version()}
    for doc in docs:
        for version in versions:
            # Raises kubernetes_validate.ValidationError on an unknown or mistyped field.
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_rejects_a_misspelled_field():
    import kubernetes_validate

    deployment = _by_kind_and_name()[("Deployment", "temper-env-server")]
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    broken = {**deployment, "spec": {**deployment["spec"]}}
    broken["spec"]["replicsa"] = broken["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError, match="replicsa"):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    # A wrong type is caught too, not only an unknown name.
    broken = {**deployment, "spec": {**deployment["spec"], "replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", sorted(FLEETS))
def test_fleet_service_hpa_pdb_and_probes_point_at_the_deployment(name):
    docs = _by_kind_and_name()
    command, port = FLEETS[name]
    deployment = docs[("Deployment", name)]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()

    container = _container(deployment)
    argv = _argv(container)
    assert argv[:2] == ["temper", command]
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert int(argv[argv.index("--port") + 1]) == port
    assert [p["containerPort"] for p in container["ports"]] == [port]
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert (get["path"], get["port"]) == ("/health", port)
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["limits"]["memory"]

    service = docs[("Service", name)]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (service_port,) = service["spec"]["ports"]
    assert (service_port["port"], service_port["targetPort"]) == (port, port)

    hpa = docs[("HorizontalPodAutoscaler", name)]
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment", name)
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 64)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"

    pdb = docs[("PodDisruptionBudget", name)]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_env_server_command_parses_and_reaches_the_sandbox_service():
    docs = _by_kind_and_name()
    argv = _argv(_container(docs[("Deployment", "temper-env-server")]))
    assert argv[:2] == ["temper", "env-serve"]
    config = argv[2]
    assert (ROOT / config).is_file()  # the image's working directory is the repository's copy
    overrides = [a for a in argv[3:] if a.startswith("--") and "=" in a]
    assert overrides == ['--env.options={sandbox_servers=["ws://temper-sandbox:8200/v1"]}']
    cfg = load_config(ROOT / config, overrides)
    (url,) = cfg.env.options["sandbox_servers"]
    sandbox = docs[("Service", "temper-sandbox")]
    (port,) = sandbox["spec"]["ports"]
    assert url == f"ws://{sandbox['metadata']['name']}:{port['port']}/v1"


def test_sandbox_pod_can_run_bubblewrap():
    deployment = _by_kind_and_name()[("Deployment", "temper-sandbox")]
    spec, container = deployment["spec"]["template"]["spec"], _container(deployment)
    security = container["securityContext"]
    # bwrap needs namespaces (seccomp), mount() (AppArmor) and an unmasked /proc, which
    # Kubernetes allows only in a pod with its own user namespace.
    assert security["seccompProfile"]["type"] == "Unconfined"
    assert security["appArmorProfile"]["type"] == "Unconfined"
    assert security["procMount"] == "Unmasked" and spec["hostUsers"] is False
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert "emptyDir" in mounts["/tmp"]
    assert mounts["/dev/shm"]["emptyDir"]["medium"] == "Memory"
