#!/usr/bin/env python3
"""Checks the Kubernetes manifests in a folder before anyone applies them.

    python3 xtask/assets/check-manifests.py deploy/kubernetes [--kubernetes-version 1.33]

Every YAML document of every *.yaml / *.yml file in the folder and its subfolders (kustomize's
kustomization.yaml excepted) is:

  1. validated against the Kubernetes OpenAPI schemas, strictly (an unknown field is an error),
     with the PyPI package kubernetes-validate, at the newest Kubernetes version the installed
     package has unless --kubernetes-version names one;
  2. checked for mounts the container runtime refuses or that would hide the container's own
     procfs or sysfs: runc refuses any mount whose destination is in /proc (its proc mount
     check), so no volume may be mounted at or under /proc (the host's /proc goes at a path of
     its own, e.g. /hostproc); and no hostPath volume may be mounted at or under /sys except
     bpffs at /sys/fs/bpf;
  3. checked for a readinessProbe and a livenessProbe on every container that keeps running
     (containers and sidecar init containers, restartPolicy: Always); run-to-completion init
     containers are excepted.

One line is printed per document checked, and one per failure; the exit status is 0 when every
document passes, 1 when any fails, 2 when the check itself cannot run (no folder, no documents,
kubernetes-validate or PyYAML missing).

Needs: pip install kubernetes-validate PyYAML (kubernetes-validate brings jsonschema).
"""

import argparse
import posixpath
import sys
from pathlib import Path

try:
    import yaml
except ImportError:  # pragma: no cover - environment
    print("check-manifests: PyYAML is missing: pip install PyYAML", file=sys.stderr)
    sys.exit(2)

try:
    import kubernetes_validate
except ImportError:  # pragma: no cover - environment
    print(
        "check-manifests: kubernetes-validate is missing: pip install kubernetes-validate",
        file=sys.stderr,
    )
    sys.exit(2)

KUSTOMIZATION_NAMES = {"kustomization.yaml", "kustomization.yml", "Kustomization"}

# Where each workload kind keeps its pod spec.
POD_SPEC_PATHS = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    "ReplicationController": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}

# hostPath volumes may be mounted here, though it is under /sys: bpffs, whose pins outlive the pod.
SYS_ALLOWED = "/sys/fs/bpf"


class UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses a mapping with the same key twice (PyYAML keeps the last one
    silently; the API server's decoder refuses it, and a reader sees only the first)."""


class DuplicateKey(yaml.YAMLError):
    pass


def _construct_mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise DuplicateKey(
                f"line {key_node.start_mark.line + 1}: the key {key!r} again (first on line "
                f"{seen[key].line + 1}); the API server refuses a duplicated key"
            )
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
)


def under(path, root):
    """Whether `path` is `root` or inside it (both absolute, normalized)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def normalized(path):
    return posixpath.normpath(path) if path else path


def dig(doc, keys):
    for k in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(k)
    return doc


def describe(doc):
    kind = doc.get("kind", "?")
    meta = doc.get("metadata") or {}
    name = meta.get("name", "?")
    ns = meta.get("namespace")
    return f"{kind} {ns}/{name}" if ns else f"{kind} {name}"


def schema_errors(doc, version):
    """The schema's complaints about `doc` (empty when it validates)."""
    if not isinstance(doc.get("apiVersion"), str) or not isinstance(doc.get("kind"), str):
        return ["no apiVersion or kind: not a Kubernetes object"]
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        return [f"schema {version} (strict): at {where}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"schema {version}: {e.message}"]
    return []


def pod_checks(doc):
    """Mount and probe failures of the pod spec `doc` holds, if it holds one."""
    keys = POD_SPEC_PATHS.get(doc.get("kind"))
    if keys is None:
        return []
    spec = dig(doc, keys)
    if not isinstance(spec, dict):
        return [f"no pod spec at {'.'.join(keys)}"]
    failures = []
    volumes = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
    groups = [
        ("initContainers", spec.get("initContainers") or []),
        ("containers", spec.get("containers") or []),
        ("ephemeralContainers", spec.get("ephemeralContainers") or []),
    ]
    for group, containers in groups:
        for c in containers:
            if not isinstance(c, dict):
                continue
            cname = f"{group[:-1]} {c.get('name', '?')}"
            for m in c.get("volumeMounts") or []:
                failures += mount_failures(cname, m, volumes)
            long_running = group == "containers" or (
                group == "initContainers" and c.get("restartPolicy") == "Always"
            )
            if long_running:
                for probe in ("readinessProbe", "livenessProbe"):
                    if not isinstance(c.get(probe), dict):
                        failures.append(
                            f"{cname} has no {probe}: every long-running container needs one"
                        )
    return failures


def mount_failures(cname, mount, volumes):
    target = normalized(mount.get("mountPath") or "")
    vname = mount.get("name")
    volume = volumes.get(vname)
    if volume is None:
        return [f"{cname} mounts volume {vname!r}, which the pod does not define"]
    host = volume.get("hostPath")
    source = normalized(host.get("path")) if isinstance(host, dict) else None
    what = f"hostPath {source}" if source else f"volume {vname!r}"
    failures = []
    if target == "/":
        failures.append(f"{cname} mounts {what} at /, over the container's whole root")
    elif under(target, "/proc"):
        hint = (
            " (mount the host's /proc at a path of its own, e.g. /hostproc, and point the "
            "program there: SOPA_PROC_ROOT=/hostproc)"
            if source and under(source, "/proc")
            else ""
        )
        failures.append(
            f"{cname} mounts {what} at {target}: runc refuses mounts into /proc{hint}"
        )
    elif source is not None and under(target, "/sys") and not under(target, SYS_ALLOWED):
        failures.append(
            f"{cname} mounts {what} at {target}, inside the container's sysfs: only bpffs at "
            f"{SYS_ALLOWED} may be; mount it elsewhere (e.g. /host{source})"
        )
    return failures


def documents(folder):
    """(file, index, document or None, load error or None) for every YAML document."""
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and p.suffix in (".yaml", ".yml")
        and p.name not in KUSTOMIZATION_NAMES
    )
    for path in files:
        rel = path.relative_to(folder)
        try:
            docs = list(yaml.load_all(path.read_text(), Loader=UniqueKeyLoader))
        except (OSError, yaml.YAMLError) as e:
            yield rel, 0, None, "does not load: " + " ".join(str(e).split())
            continue
        n = 0
        for doc in docs:
            if doc is None:
                continue
            n += 1
            if not isinstance(doc, dict):
                yield rel, n, None, "is not a mapping (a Kubernetes object)"
                continue
            if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
                for item in doc["items"]:
                    yield rel, n, item, None if isinstance(item, dict) else "an item is not a mapping"
                continue
            yield rel, n, doc, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the manifests' folder, e.g. deploy/kubernetes")
    parser.add_argument(
        "--kubernetes-version",
        help="the schemas' Kubernetes version (default: the newest kubernetes-validate has)",
    )
    args = parser.parse_args()
    if not args.folder.is_dir():
        print(f"check-manifests: {args.folder} is not a folder", file=sys.stderr)
        return 2
    version = args.kubernetes_version or kubernetes_validate.latest_version()
    print(
        f"check-manifests: {args.folder}, Kubernetes schemas {version} (strict), "
        f"kubernetes-validate {kubernetes_validate.__version__}"
    )
    checked = failed = 0
    for rel, n, doc, error in documents(args.folder):
        checked += 1
        where = f"{rel}#{n}" if n else str(rel)
        if error is not None:
            failures = [error]
            what = "?"
        else:
            what = describe(doc)
            failures = schema_errors(doc, version) + pod_checks(doc)
        if failures:
            failed += 1
            print(f"FAIL {where} {what}")
            for f in failures:
                print(f"  - {f}")
        else:
            print(f"ok   {where} {what}")
    if checked == 0:
        print(f"check-manifests: no YAML documents in {args.folder}", file=sys.stderr)
        return 2
    if failed:
        print(f"check-manifests: {failed} of {checked} documents failed", file=sys.stderr)
        return 1
    print(f"check-manifests: {checked} documents passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
