"""Write tests/fixtures/kuberay_schema.json: the KubeRay CRD schema facts that rlsys's
rendered manifests touch, so the KubeRay tests validate without the CRDs beside the repo.

    python scripts/kuberay_schema.py CRD_DIR --ref "KubeRay <commit or tag>, <date>"

CRD_DIR holds KubeRay's ``ray.io_rayjobs.yaml`` and ``ray.io_rayclusters.yaml``
(``ray-operator/config/crd/bases/`` of the KubeRay repository). For each kind the script
renders every manifest variant of tests/unit/test_kuberay.py and the committed k8s/ files,
then keeps the CRD's v1 openAPIV3Schema along the paths those manifests use:

* every object on such a path keeps the names of all its CRD fields, so a misspelled or
  unknown field is still rejected (``additionalProperties: false`` is written out: the API
  server prunes undeclared fields, which for a manifest we render means a lost setting);
* every field keeps its type facts (type, format, pattern, enum, int-or-string, required);
* a field rlsys does not render keeps its own type but not its contents
  (``x-rlsys-unchecked``).

Descriptions and defaults are dropped. Rerun it when the renderer starts setting a new
field (the test then fails with "unknown field") or to follow a newer KubeRay.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures" / "kuberay_schema.json"
CRD_FILES = {"RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
# facts of one field that describe its own value, not its children
SCALAR_FACTS = (
    "type",
    "format",
    "pattern",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "nullable",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
)


def _facts(schema: dict) -> dict:
    out = {k: schema[k] for k in SCALAR_FACTS if k in schema}
    if "anyOf" in schema:  # int-or-string: [{type: integer}, {type: string}]
        out["anyOf"] = [{k: v for k, v in s.items() if k in SCALAR_FACTS} for s in schema["anyOf"]]
    return out


def prune(schema: dict, values: list[Any]) -> dict:
    """``schema`` cut down to what ``values`` (instances of it) reach; see the module doc."""
    out = _facts(schema)
    if not values:  # a field rlsys does not render: its own type only
        if any(k in schema for k in ("properties", "items", "additionalProperties")):
            out["x-rlsys-unchecked"] = True
        return out
    if "required" in schema:
        out["required"] = schema["required"]
    dicts = [v for v in values if isinstance(v, dict)]
    if "properties" in schema:
        out["properties"] = {
            name: prune(sub, [d[name] for d in dicts if name in d])
            for name, sub in schema["properties"].items()
        }
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = prune(
            schema["additionalProperties"], [x for d in dicts for x in d.values()]
        )
    elif schema.get("type") == "object" and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if isinstance(schema.get("items"), dict):
        lists = [v for v in values if isinstance(v, list)]
        out["items"] = prune(schema["items"], [x for v in lists for x in v])
    return out


def rendered_manifests() -> list[dict]:
    """Every variant the KubeRay tests render, and the committed k8s/ manifests."""
    sys.path.insert(0, str(REPO))
    path = REPO / "tests" / "unit" / "test_kuberay.py"
    spec = importlib.util.spec_from_file_location("kuberay_tests", path)
    tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tests)
    base = tests.load_config(["launcher=kuberay"])
    docs = [d for v in tests.VARIANTS.values() for d in tests.rendered(tests.configured(base, v))]
    for name in tests.K8S_FILES:
        docs += list(yaml.safe_load_all((REPO / "k8s" / name).read_text()))
    return [d for d in docs if d["kind"] in CRD_FILES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("crd_dir", type=Path, help="folder with KubeRay's CRD YAML files")
    parser.add_argument("--ref", required=True, help="the KubeRay commit or tag, and its date")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    docs = rendered_manifests()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    kinds = {}
    for kind, name in CRD_FILES.items():
        crd = yaml.load((args.crd_dir / name).read_text(), Loader=loader)
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        schema = version["schema"]["openAPIV3Schema"]
        body = [{k: v for k, v in d.items() if k != "metadata"} for d in docs if d["kind"] == kind]
        kinds[kind] = prune(schema, body)
    out = {
        "about": "KubeRay's v1 CRD schemas cut down to the fields rlsys renders; written by "
        "scripts/kuberay_schema.py (its docstring says how), not edited by hand",
        "kuberay": args.ref,
        "kinds": kinds,
    }
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
