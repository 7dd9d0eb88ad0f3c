"""corral k8s render: the builders' output, checked field by field and validated
offline against the Kubernetes (release-1.36) and agent-sandbox schemas in
tests/data/k8s (SOURCE.md there says where they come from).  No cluster here."""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from corral import cli, k8s, seccomp
from corral import policy as policy_mod
from corral.errors import EXIT_REFUSED, EXIT_USAGE, CorralError

DATA = Path(__file__).resolve().parent.parent / "data" / "k8s"
KINDS = {
    ("v1", "Pod"): "io.k8s.api.core.v1.Pod",
    ("v1", "Service"): "io.k8s.api.core.v1.Service",
    ("v1", "ConfigMap"): "io.k8s.api.core.v1.ConfigMap",
    ("v1", "Secret"): "io.k8s.api.core.v1.Secret",
    ("apps/v1", "Deployment"): "io.k8s.api.apps.v1.Deployment",
    ("networking.k8s.io/v1", "NetworkPolicy"): "io.k8s.api.networking.v1.NetworkPolicy",
    ("node.k8s.io/v1", "RuntimeClass"): "io.k8s.api.node.v1.RuntimeClass",
}
CRDS = {
    ("agents.x-k8s.io/v1beta1", "Sandbox"): "agents.x-k8s.io_sandboxes.yaml",
    ("extensions.agents.x-k8s.io/v1beta1", "SandboxTemplate"): (
        "extensions.agents.x-k8s.io_sandboxtemplates.yaml"
    ),
}

PROXY = """\
[network]
mode = "proxy"
allow = ["pypi.org", "files.pythonhosted.org:443"]

[limits]
memory = "512m"
cpus = 1.5
timeout = "10m"
"""
NO_NETWORK = """\
[limits]
memory = "256m"
"""
ADDRESSES = """\
[network]
mode = "proxy"
allow = ["10.1.2.3:443"]
"""
NOTHING_ALLOWED = """\
[network]
mode = "proxy"
"""
SECRETS = """\
[network]
mode = "proxy"
allow = ["api.github.com"]

[secrets.GH_TOKEN]
from = "env:K8S_TEST_GH"
hosts = ["api.github.com"]
header = "authorization"
format = "Bearer {value}"

[secrets.NPM_TOKEN]
from = "file:/run/secrets/npm"
hosts = ["api.github.com"]
header = "x-npm"
"""


# -- schemas -----------------------------------------------------------------


def _strict(node: Any) -> Any:
    """As the API server's strict field validation: unknown fields are errors."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@cache
def _definitions() -> dict[str, Any]:
    defs: dict[str, Any] = json.loads((DATA / "k8s-definitions.json").read_text())["definitions"]
    defs = _strict(defs)
    # the v2 document spells IntOrString as a string with a format
    defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["integer", "string"]}
    return defs


@cache
def _crd_schema(filename: str) -> dict[str, Any]:
    crd = yaml.safe_load((DATA / filename).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    schema: dict[str, Any] = _strict(version["schema"]["openAPIV3Schema"])
    return schema


def validate(obj: dict[str, Any]) -> None:
    """jsonschema.ValidationError unless the object fits its kind's schema."""
    key = (obj["apiVersion"], obj["kind"])
    if key in CRDS:
        jsonschema.Draft7Validator(_crd_schema(CRDS[key])).validate(obj)
        return
    name = KINDS[key]
    schema = {"$ref": f"#/definitions/{name}", "definitions": _definitions()}
    jsonschema.Draft4Validator(schema).validate(obj)
    gvk = _definitions()[name]["x-kubernetes-group-version-kind"][0]
    group = f"{gvk['group']}/" if gvk["group"] else ""
    assert obj["apiVersion"] == group + gvk["version"] and obj["kind"] == gvk["kind"]


# -- helpers -----------------------------------------------------------------


def load(tmp_path: Path, text: str) -> policy_mod.Policy:
    path = tmp_path / "corral.toml"
    path.write_text(text)
    policy = policy_mod.load(str(tmp_path), str(path))
    policy_mod.check_network(policy)
    return policy


def opts(**kw: Any) -> k8s.Options:
    kw.setdefault("image", "python:3.12-slim")
    kw.setdefault("proxy_image", "example.org/corral:1")
    return k8s.Options(**kw)


def render(tmp_path: Path, text: str, **kw: Any) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = k8s.render(load(tmp_path, text), text, opts(**kw))
    json.dumps(objects)  # plain JSON types only
    return objects


def one(objects: list[dict[str, Any]], kind: str, name: str = "") -> dict[str, Any]:
    found = [
        o for o in objects if o["kind"] == kind and (not name or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (kind, name, [o["kind"] for o in objects])
    return found[0]


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    for o in objects:
        if o["kind"] == "Pod":
            return dict(o["spec"])
        if o["kind"] in ("Sandbox", "SandboxTemplate"):
            return dict(o["spec"]["podTemplate"]["spec"])
    raise AssertionError("no sandbox")


# -- validation against the schemas --------------------------------------------


@pytest.mark.parametrize("kind", ["pod", "template", "sandbox"])
@pytest.mark.parametrize(
    "text", [PROXY, NO_NETWORK, ADDRESSES, NOTHING_ALLOWED, SECRETS], ids=lambda t: t[:18]
)
@pytest.mark.parametrize("gvisor", [False, True], ids=["runc", "gvisor"])
def test_every_object_fits_its_schema(
    tmp_path: Path, kind: str, text: str, gvisor: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("K8S_TEST_GH", "not-a-real-token")
    objects = render(tmp_path, text, kind=kind, gvisor=gvisor, namespace="agents")
    for obj in objects:
        validate(obj)
    assert all(
        o["metadata"].get("namespace") == "agents" for o in objects if o["kind"] != "RuntimeClass"
    )


@pytest.mark.parametrize("kind", ["pod", "template", "sandbox"])
def test_the_schemas_refuse_an_unknown_field(tmp_path: Path, kind: str) -> None:
    """The twin of the test above: the strict schemas do catch a misspelt field."""
    objects = render(tmp_path, PROXY, kind=kind)
    sandbox = objects[-1]
    validate(sandbox)
    spec = pod_spec(objects)
    spec["containers"][0]["securityContext"]["readOnlyRootFS"] = True
    bad = json.loads(json.dumps(sandbox))
    if kind == "pod":
        bad["spec"] = spec
    else:
        bad["spec"]["podTemplate"]["spec"] = spec
    with pytest.raises(jsonschema.ValidationError, match="readOnlyRootFS"):
        validate(bad)
    policy = json.loads(json.dumps(one(objects, "NetworkPolicy", "corral-sandbox")))
    policy["spec"]["egres"] = []
    with pytest.raises(jsonschema.ValidationError, match="egres"):
        validate(policy)


# -- the sandbox ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["pod", "template", "sandbox"])
def test_sandbox_is_locked_down(tmp_path: Path, kind: str) -> None:
    spec = pod_spec(render(tmp_path, PROXY, kind=kind))
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "corral/default.json",
    }
    (box,) = spec["containers"]
    sc = box["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert not spec["hostNetwork"] and not spec["hostPID"] and not spec["hostIPC"]
    # no cluster DNS: names are the proxy's to resolve
    assert spec["dnsPolicy"] == "None" and spec["dnsConfig"]["nameservers"] == ["127.0.0.1"]
    mounts = {m["mountPath"]: m["name"] for m in box["volumeMounts"]}
    assert mounts[k8s.WORKSPACE] == "workspace"
    assert {"/tmp", "/var/tmp", "/dev/shm"} <= set(mounts)
    assert box["workingDir"] == k8s.WORKSPACE


def test_workspace_from_a_claim(tmp_path: Path) -> None:
    spec = pod_spec(render(tmp_path, PROXY, workspace_claim="repo"))
    vol = {v["name"]: v for v in spec["volumes"]}["workspace"]
    assert vol == {"name": "workspace", "persistentVolumeClaim": {"claimName": "repo"}}
    spec = pod_spec(render(tmp_path, PROXY))
    assert {v["name"]: v for v in spec["volumes"]}["workspace"] == {
        "name": "workspace",
        "emptyDir": {},
    }


def test_proxy_variables_point_at_the_service(tmp_path: Path) -> None:
    objects = render(tmp_path, PROXY, name="evals")
    env = {e["name"]: e.get("value") for e in pod_spec(objects)["containers"][0]["env"]}
    service = one(objects, "Service", "evals-proxy")
    assert k8s.service_env_prefix(opts(name="evals")) == "EVALS_PROXY"
    want = "http://$(EVALS_PROXY_SERVICE_HOST):$(EVALS_PROXY_SERVICE_PORT)"
    assert env["HTTP_PROXY"] == env["HTTPS_PROXY"] == env["https_proxy"] == want
    assert env["ALL_PROXY"] == env["all_proxy"] == want  # httpx fails on a socks5h:// one
    assert env["SOCKS_PROXY"].startswith("socks5h://$(EVALS_PROXY_SERVICE_HOST)")
    assert service["spec"]["ports"][0]["port"] == k8s.PROXY_PORT
    assert pod_spec(objects)["enableServiceLinks"] is True
    # the Service exists before the sandbox starts (its variables are set only then)
    kinds = [o["kind"] for o in objects]
    assert kinds.index("Service") < kinds.index("Pod")


def test_no_network_no_proxy_variables(tmp_path: Path) -> None:
    env = {e["name"] for e in pod_spec(render(tmp_path, NO_NETWORK))["containers"][0]["env"]}
    assert not env & {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "SOCKS_PROXY"}


def test_limits_become_resources(tmp_path: Path) -> None:
    spec = pod_spec(render(tmp_path, PROXY))
    res = spec["containers"][0]["resources"]
    assert res["limits"] == {"memory": "512Mi", "cpu": "1500m"}
    assert res["requests"] == res["limits"]
    assert spec["activeDeadlineSeconds"] == 600


def test_no_limits_no_resources(tmp_path: Path) -> None:
    """This host's default bounds say nothing about a cluster's nodes: only set ones go."""
    spec = pod_spec(render(tmp_path, NOTHING_ALLOWED))
    assert "resources" not in spec["containers"][0]
    assert "activeDeadlineSeconds" not in spec


# -- seccomp and gVisor ----------------------------------------------------------


def test_seccomp_profile_is_corrals_rules(tmp_path: Path) -> None:
    objects = render(tmp_path, PROXY)
    data = one(objects, "ConfigMap", "corral-seccomp")["data"]
    profile = json.loads(data["default.json"])
    assert profile == k8s.seccomp_profile(False)
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    denied = {n for entry in profile["syscalls"] for n in entry["names"]}
    assert {r.name for r in seccomp.default_deny_rules()} == denied
    # an unconditional rule keeps its errno
    ptrace = [e for e in profile["syscalls"] if e["names"] == ["ptrace"]]
    assert ptrace == [{"names": ["ptrace"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]
    # under gVisor: as the container tier (clone3 allowed, namespace flags refused)
    gvisor = json.loads(data["gvisor.json"])
    assert "clone3" not in {n for e in gvisor["syscalls"] for n in e["names"]}
    assert "clone3" in denied


def test_gvisor_runtime_class(tmp_path: Path) -> None:
    objects = render(tmp_path, PROXY, gvisor=True)
    rc = one(objects, "RuntimeClass")
    assert rc["metadata"]["name"] == "gvisor" and rc["handler"] == "runsc"
    spec = pod_spec(objects)
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["securityContext"]["seccompProfile"]["localhostProfile"] == "corral/gvisor.json"


def test_no_gvisor_no_runtime_class(tmp_path: Path) -> None:
    objects = render(tmp_path, PROXY)
    assert not [o for o in objects if o["kind"] == "RuntimeClass"]
    assert "runtimeClassName" not in pod_spec(objects)


def test_policy_tier_gvisor_asks_for_it(tmp_path: Path) -> None:
    objects = render(tmp_path, 'tier = "gvisor"\n' + PROXY)
    assert pod_spec(objects)["runtimeClassName"] == "gvisor"


# -- network policies ------------------------------------------------------------


def _sandbox_policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "NetworkPolicy", "corral-sandbox")["spec"]
    return spec


def test_sandbox_reaches_the_proxy_port_and_nothing_else(tmp_path: Path) -> None:
    objects = render(tmp_path, PROXY)
    spec = _sandbox_policy(objects)
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == []
    (rule,) = spec["egress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": k8s.PROXY_PORT}]
    (peer,) = rule["to"]
    assert set(peer) == {"podSelector"}  # no ipBlock, no namespace: not kube-dns either
    proxy_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert peer["podSelector"]["matchLabels"].items() <= proxy_labels.items()
    sandbox_labels = one(objects, "Pod")["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= sandbox_labels.items()
    # the proxy admits the sandbox on its port only
    proxy = one(objects, "NetworkPolicy", "corral-proxy")["spec"]
    (inbound,) = proxy["ingress"]
    assert inbound["ports"] == [{"protocol": "TCP", "port": k8s.PROXY_PORT}]
    assert inbound["from"] == [{"podSelector": {"matchLabels": spec["podSelector"]["matchLabels"]}}]


@pytest.mark.parametrize("kind", ["template", "sandbox"])
def test_agent_sandbox_pods_fall_under_corrals_policy(tmp_path: Path, kind: str) -> None:
    objects = render(tmp_path, PROXY, kind=kind)
    sandbox = objects[-1]
    labels = sandbox["spec"]["podTemplate"]["metadata"]["labels"]
    assert _sandbox_policy(objects)["podSelector"]["matchLabels"].items() <= labels.items()
    if kind == "template":
        # agent-sandbox's managed default would let the pods reach the public internet
        assert sandbox["spec"]["networkPolicyManagement"] == "Unmanaged"


def test_without_a_network_no_egress_at_all(tmp_path: Path) -> None:
    objects = render(tmp_path, NO_NETWORK)
    spec = _sandbox_policy(objects)
    assert spec["egress"] == [] and "Egress" in spec["policyTypes"]
    assert {o["kind"] for o in objects} == {"ConfigMap", "NetworkPolicy", "Pod"}


def test_allowed_name_gives_the_proxy_public_egress_and_dns(tmp_path: Path) -> None:
    egress = one(render(tmp_path, PROXY), "NetworkPolicy", "corral-proxy")["spec"]["egress"]
    blocks = [p["ipBlock"] for r in egress for p in r["to"] if "ipBlock" in p]
    v4 = next(b for b in blocks if b["cidr"] == "0.0.0.0/0")
    assert "169.254.0.0/16" in v4["except"] and "10.0.0.0/8" in v4["except"]
    dns = [r for r in egress if any("namespaceSelector" in p for p in r["to"])]
    assert dns and {p["port"] for p in dns[0]["ports"]} == {53}
    # files.pythonhosted.org:443 carries its port
    assert any(
        r.get("ports") == [{"protocol": "TCP", "port": 443}, {"protocol": "UDP", "port": 443}]
        for r in egress
    )


def test_allowed_address_gives_that_address_only(tmp_path: Path) -> None:
    egress = one(render(tmp_path, ADDRESSES), "NetworkPolicy", "corral-proxy")["spec"]["egress"]
    (rule,) = egress  # no DNS: nothing to look up
    assert rule["to"] == [{"ipBlock": {"cidr": "10.1.2.3/32"}}]
    assert {p["port"] for p in rule["ports"]} == {443}


def test_nothing_allowed_gives_the_proxy_no_egress(tmp_path: Path) -> None:
    spec = one(render(tmp_path, NOTHING_ALLOWED), "NetworkPolicy", "corral-proxy")["spec"]
    assert spec["egress"] == [] and "Egress" in spec["policyTypes"]


# -- the proxy ---------------------------------------------------------------------


def test_proxy_runs_corral_proxy_serve_with_the_policy(tmp_path: Path) -> None:
    objects = render(tmp_path, PROXY)
    deployment = one(objects, "Deployment", "corral-proxy")
    pod = deployment["spec"]["template"]["spec"]
    (box,) = pod["containers"]
    assert box["image"] == "example.org/corral:1"
    command = box["command"]
    assert command[:3] == ["corral", "proxy", "serve"]
    parsed, rest = cli.parse(
        command[3:], cli.SERVE_OPTIONS, positional=False, command="proxy serve"
    )
    assert rest == []
    assert parsed["listen"] == f"0.0.0.0:{k8s.PROXY_PORT}"
    policy_path = str(parsed["policy"])
    mounts = {m["mountPath"]: m["name"] for m in box["volumeMounts"]}
    assert mounts[os.path.dirname(policy_path)] == "policy"
    config = one(objects, "ConfigMap", "corral-policy")
    assert config["data"][os.path.basename(policy_path)] == PROXY  # the file, as written
    assert pod["automountServiceAccountToken"] is False
    assert box["securityContext"]["readOnlyRootFilesystem"] is True
    assert box["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # its state (audit log) on a writable volume, the root being read-only
    assert str(parsed["net_log"]).startswith(k8s.PROXY_STATE) and mounts[k8s.PROXY_STATE] == "state"


def test_secrets_are_named_never_filled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("K8S_TEST_GH", "ghp_value_that_must_not_appear")
    objects = render(tmp_path, SECRETS)
    text = json.dumps(objects)
    assert "ghp_value_that_must_not_appear" not in text
    assert not [o for o in objects if o["kind"] == "Secret"]  # the user makes it
    box = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in box["env"]}
    assert env["K8S_TEST_GH"]["valueFrom"] == {
        "secretKeyRef": {"name": "corral-secrets", "key": "K8S_TEST_GH"}
    }
    npm = [m for m in box["volumeMounts"] if m["mountPath"] == "/run/secrets/npm"]
    assert npm and npm[0]["subPath"] == "NPM_TOKEN" and npm[0]["readOnly"]
    assert k8s.secret_names(load(tmp_path, SECRETS)) == ["K8S_TEST_GH", "NPM_TOKEN"]
    # inspection: the user CA from the Secret corral-ca, its certificate in the sandbox
    assert {"name": "ca", "mountPath": k8s.PROXY_CA_DIR, "readOnly": True} in box["volumeMounts"]
    sandbox = pod_spec(objects)["containers"][0]
    assert any(m["mountPath"] == k8s.SANDBOX_CA for m in sandbox["volumeMounts"])
    # and the sandbox has no secret of its own
    assert not [e for e in sandbox["env"] if "valueFrom" in e]


def test_no_inspection_no_ca(tmp_path: Path) -> None:
    objects = render(tmp_path, PROXY)
    box = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert not [m for m in box["volumeMounts"] if m["name"] == "ca"]
    assert not [m for m in pod_spec(objects)["containers"][0]["volumeMounts"] if m["name"] == "ca"]


# -- what cannot be honoured --------------------------------------------------------


@pytest.mark.parametrize("tier", ["landlock", "namespace", "microvm", "none"])
def test_tiers_a_pod_cannot_honour_are_refused(tmp_path: Path, tier: str) -> None:
    with pytest.raises(CorralError) as err:
        render(tmp_path, f'tier = "{tier}"\n' + PROXY)
    assert err.value.code == EXIT_REFUSED
    assert tier in err.value.message and "\n" not in err.value.message


@pytest.mark.parametrize("tier", ["container", "gvisor", "auto"])
def test_tiers_a_pod_can_honour(tmp_path: Path, tier: str) -> None:
    validate(render(tmp_path, f'tier = "{tier}"\n' + PROXY)[-1])


def test_a_user_ca_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("K8S_TEST_GH", "x")
    (tmp_path / "ca.pem").write_text("x")
    (tmp_path / "key.pem").write_text("x")
    text = SECRETS + f'\n[tls]\nca_cert = "{tmp_path}/ca.pem"\nca_key = "{tmp_path}/key.pem"\n'
    with pytest.raises(CorralError) as err:
        render(tmp_path, text)
    assert err.value.code == EXIT_REFUSED and "corral-ca" in err.value.message


@pytest.mark.parametrize("table", ["guardrails", "tls"])
def test_files_of_this_machine_are_refused(tmp_path: Path, table: str) -> None:
    """Policy keys that name files here (the pod has none of them): refused, not dropped."""
    (tmp_path / "rails").mkdir()
    (tmp_path / "up.pem").write_text("x")
    key = 'dirs = ["rails"]' if table == "guardrails" else f'upstream_ca = ["{tmp_path}/up.pem"]'
    with pytest.raises(CorralError) as err:
        render(tmp_path, PROXY + f"\n[{table}]\n{key}\n")
    assert err.value.code == EXIT_REFUSED and table in err.value.message


def test_limits_a_pod_has_no_field_for_are_refused(tmp_path: Path) -> None:
    """A render dropped [limits] pids silently: the pod could fork without bound."""
    with pytest.raises(CorralError) as err:
        render(tmp_path, PROXY + "pids = 64\n")  # (PROXY ends in its [limits] table)
    assert err.value.code == EXIT_REFUSED
    assert "[limits] pids cannot be rendered" in str(err.value.message)
    validate(render(tmp_path, PROXY)[-1])  # the twin: the limits a pod spec holds render


def test_missing_images_are_usage_errors(tmp_path: Path) -> None:
    policy = load(tmp_path, PROXY)
    with pytest.raises(CorralError) as err:
        k8s.render(policy, PROXY, k8s.Options(image=""))
    assert err.value.code == EXIT_USAGE and "--image" in err.value.message
    with pytest.raises(CorralError) as err:
        k8s.render(policy, PROXY, k8s.Options(image="x"))
    assert err.value.code == EXIT_USAGE and "--proxy-image" in err.value.message
    # no network: no proxy, so no proxy image needed
    k8s.render(load(tmp_path, NO_NETWORK), NO_NETWORK, k8s.Options(image="x"))


@pytest.mark.parametrize("name", ["Corral", "-x", "a_b", "x" * 60, "", "9lives", "x-"])
def test_bad_names(name: str) -> None:
    with pytest.raises(CorralError) as err:
        k8s.check_names(opts(name=name))
    assert err.value.code == EXIT_USAGE
    k8s.check_names(opts(name="corral-evals-1"))


# -- the command line --------------------------------------------------------------


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_renders_a_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.toml"
    path.write_text(PROXY)
    args = ["k8s", "render", "--policy", str(path), "--image", "img", "--proxy-image", "p"]
    code, out, err = _cli([*args, "--template", "--namespace", "ns", "--gvisor"], capsys)
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert doc["apiVersion"] == "v1" and doc["kind"] == "List"
    kinds = [o["kind"] for o in doc["items"]]
    assert kinds[0] == "RuntimeClass" and kinds[-1] == "SandboxTemplate"
    for obj in doc["items"]:
        validate(obj)


@pytest.mark.parametrize(
    ("extra", "code", "words"),
    [
        (["--tier-x"], EXIT_USAGE, "--tier-x"),
        (["--template", "--sandbox"], EXIT_USAGE, "one of them"),
        (["--name", "Bad_Name"], EXIT_USAGE, "--name"),
    ],
)
def test_cli_bad_input_is_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    code: int,
    words: str,
) -> None:
    path = tmp_path / "p.toml"
    path.write_text(PROXY)
    args = ["k8s", "render", "--policy", str(path), "--image", "i", "--proxy-image", "p"]
    got, out, err = _cli([*args, *extra], capsys)
    assert got == code and out == ""
    assert err.count("\n") == 1 and words in err


def test_cli_refused_tier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.toml"
    path.write_text('tier = "landlock"\n' + PROXY)
    code, out, err = _cli(["k8s", "render", "--policy", str(path), "--image", "i"], capsys)
    assert code == EXIT_REFUSED and out == "" and err.count("\n") == 1 and "landlock" in err


def test_cli_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["k8s"], capsys)[0] == EXIT_USAGE
    code, _, err = _cli(["k8s", "render", "--image", "i"], capsys)
    assert code == EXIT_USAGE and "--policy" in err
    code, _, err = _cli(["k8s", "render", "--policy", str(tmp_path / "none.toml")], capsys)
    assert code == EXIT_USAGE and err.count("\n") == 1
    code, out, _ = _cli(["k8s", "--help"], capsys)
    assert code == 0
    for option in ("--policy", "--gvisor", "--template", "--namespace", "--image"):
        assert option in out
    assert "122  refused" in out and "2  bad command line" in out


def test_cli_seccomp_profile(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(["k8s", "render", "--seccomp-profile"], capsys)
    assert code == 0 and json.loads(out) == k8s.seccomp_profile(False)
    code, out, _ = _cli(["k8s", "render", "--seccomp-profile", "--gvisor"], capsys)
    assert code == 0 and json.loads(out) == k8s.seccomp_profile(True)
