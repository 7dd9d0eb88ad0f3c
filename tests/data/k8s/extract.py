"""Regenerate k8s-definitions.json: the definitions the rendered kinds reach, from
the Kubernetes OpenAPI (v2) document, descriptions left out to keep it small.

    python tests/data/k8s/extract.py swagger.json > tests/data/k8s/k8s-definitions.json
"""

from __future__ import annotations

import json
import sys

ROOTS = (
    "io.k8s.api.core.v1.Pod",
    "io.k8s.api.core.v1.Service",
    "io.k8s.api.core.v1.ConfigMap",
    "io.k8s.api.core.v1.Secret",
    "io.k8s.api.apps.v1.Deployment",
    "io.k8s.api.networking.v1.NetworkPolicy",
    "io.k8s.api.node.v1.RuntimeClass",
)


def refs(node: object) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            found.add(ref.rsplit("/", 1)[1])
        for value in node.values():
            found |= refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= refs(value)
    return found


def strip(node: object) -> object:
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        definitions = json.load(f)["definitions"]
    todo, kept = list(ROOTS), {}
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        kept[name] = strip(definitions[name])
        todo += sorted(refs(definitions[name]) - set(kept))
    json.dump({"definitions": dict(sorted(kept.items()))}, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
