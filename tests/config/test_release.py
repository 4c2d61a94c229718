"""What is shipped agrees with itself: one version number (package, API schema, image tag
and label, CHANGELOG), and the Kubernetes manifests roll in order (migrations before web
and workers; docs/OPERATIONS.md, "Upgrades")."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "platform" / "k8s"


def manifests() -> dict[str, dict]:
    """(kind/name) -> document, over every file the kustomization applies."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    out = {}
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            if doc:
                out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def test_one_version_for_the_package_the_schema_the_image_and_the_changelog(settings):
    from config.version import VERSION

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert VERSION == pyproject  # the installed metadata is not stale
    assert settings.SPECTACULAR_SETTINGS["VERSION"] == pyproject
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert [i["newTag"] for i in kustomization["images"]] == [pyproject]
    dockerfile = (ROOT / "platform" / "Dockerfile").read_text()
    assert re.search(r'org\.opencontainers\.image\.version="([^"]+)"', dockerfile)[1] == pyproject
    assert f"kvinject:{pyproject} " in dockerfile
    released = re.findall(r"^## \[?(\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert released and released[0] == pyproject


def test_the_served_schema_carries_the_version(client):
    from config.version import VERSION

    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert response.json()["info"]["version"] == VERSION


def test_web_and_workers_wait_for_the_migrate_job_before_they_start():
    docs = manifests()
    job = docs["Job/kvinject-migrate"]["spec"]["template"]["spec"]["containers"][0]
    assert job["command"][:3] == ["python", "manage.py", "migrate"]
    for name in ("kvinject-web", "kvinject-gpu-worker"):
        pod = docs[f"Deployment/{name}"]["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        main = pod["containers"][0]
        script = " ".join(init.get("command", []) + init.get("args", []))
        # a loop until the schema has every migration of this image; never a second migrator
        assert re.search(r"until python manage\.py migrate --check\b", script), script
        assert "migrate --noinput" not in script and "; do " in script
        assert init["image"] == main["image"] == "kvinject"
        assert init["envFrom"] == main["envFrom"]  # the same database


def test_the_image_collects_static_files_and_the_ingress_terminates_tls():
    dockerfile = (ROOT / "platform" / "Dockerfile").read_text()
    build, user = dockerfile.index("collectstatic --noinput"), dockerfile.index("USER kvi")
    assert dockerfile.index("pip install -e .") < build < user
    docs = manifests()
    config = docs["ConfigMap/kvinject-config"]["data"]
    assert config["DJANGO_SECURE_PROXY_SSL_HEADER"] == "1"
    assert config["DJANGO_CSRF_TRUSTED_ORIGINS"].startswith("https://")
    ingress = docs["Ingress/kvinject-web"]
    assert ingress["spec"]["tls"] and \
        ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
