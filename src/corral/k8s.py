"""``corral k8s render``: a policy as Kubernetes objects a person can apply.

Pure builders: a loaded :class:`~corral.policy.Policy`, the policy file's text
and a :class:`Options` in, a list of plain dicts out (JSON-ready, one per
object).  Nothing here talks to a cluster.  The shape of what is rendered:

* the sandbox: a Pod (or an agent-sandbox ``SandboxTemplate`` / ``Sandbox``)
  that runs as a non-root user on a read-only root, with every capability
  dropped, corral's seccomp rules as a ``Localhost`` profile, no service-account
  token, the policy's limits as resources, and no DNS server of its own: it finds
  the proxy through the Service's environment variables, so it needs no name
  lookups, and every name it asks for is resolved by the proxy;
* the governing proxy (``corral proxy serve`` with the policy, from a ConfigMap)
  as a Deployment and a Service, its ``[secrets.NAME]`` sources from a Secret
  that the manifests name but never fill;
* NetworkPolicies: the sandbox may reach the proxy's port and nothing else (no
  egress at all without a network); the proxy is reached from the sandbox alone
  and reaches what the policy allows.
"""

from __future__ import annotations

from corral.errors import PolicyError, RefusedError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.policy import Policy
    from corral.seccomp import SyscallRule

PROXY_PORT = 3128
# where the proxy keeps its state (audit log, user CA): an emptyDir, the root is read-only
PROXY_STATE = "/var/lib/corral"
POLICY_DIR = "/etc/corral/policy"
POLICY_KEY = "corral.toml"
WORKSPACE = "/workspace"
# relative to the kubelet's seccomp root (/var/lib/kubelet/seccomp by default)
SECCOMP_PROFILE = "corral/default.json"
SECCOMP_GVISOR_PROFILE = "corral/gvisor.json"
SANDBOX_CA = "/etc/corral/ca.crt"
# the Secret NAME-ca: the user CA (key and certificate) and its certificate alone, as
# corral keeps them in its state directory (corral.net.trust.USER_CA, USER_CA_CERT)
CA_KEYS = ("corral-ca.pem", "corral-ca.crt")
PROXY_CA_DIR = f"{PROXY_STATE}/corral/ca"
USER_ID = 65532  # an unprivileged id no image is likely to give a name
# tiers a pod can honour: the container runtime is the isolation (runc, or runsc)
POD_TIERS = ("auto", "container", "gvisor")
# where a sandbox's proxy egress may not go when the policy names hosts by name: the
# NetworkPolicy cannot see names, so names mean "the public internet" there (the
# proxy still decides by name); private, link-local (cloud metadata) and shared ranges
# stay closed
PRIVATE_V4 = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10")
PRIVATE_V6 = ("fc00::/7", "fe80::/10")
LABEL = "corral.dev/role"


class Options:
    """What the command line adds to the policy."""

    __slots__ = (
        "gvisor",
        "image",
        "kind",
        "name",
        "namespace",
        "proxy_image",
        "workspace_claim",
    )

    def __init__(
        self,
        image: str,
        proxy_image: str = "",
        name: str = "corral",
        namespace: str = "",
        gvisor: bool = False,
        kind: str = "pod",
        workspace_claim: str = "",
    ) -> None:
        self.image = image
        self.proxy_image = proxy_image
        self.name = name
        self.namespace = namespace
        self.gvisor = gvisor
        self.kind = kind  # pod, template (SandboxTemplate) or sandbox (Sandbox)
        self.workspace_claim = workspace_claim  # a PersistentVolumeClaim, else an emptyDir


# -- checks ------------------------------------------------------------------


def _is_label(text: str, most: int) -> bool:
    """A DNS-1123 label: lower-case letters, digits and '-', not at either end."""
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-")
    return 0 < len(text) <= most and set(text) <= allowed and text[0] != "-" and text[-1] != "-"


def check_names(opts: Options) -> None:
    """PolicyError for a --name or --namespace Kubernetes would refuse."""
    # the longest suffix is "-seccomp" and a label holds 63; a Service's name (NAME-proxy)
    # must begin with a letter
    if not (_is_label(opts.name, 63 - len("-seccomp")) and opts.name[0].isalpha()):
        raise PolicyError(
            f"--name {opts.name!r}: a letter, then lower-case letters, digits and '-' (at most 55)"
        )
    if opts.namespace and not _is_label(opts.namespace, 63):
        raise PolicyError(f"--namespace {opts.namespace!r}: not a Kubernetes namespace name")


def check(policy: Policy, opts: Options) -> None:
    """RefusedError (122) for what a pod cannot honour, PolicyError (2) for what the
    command line lacks.  One line each, naming why."""
    if policy.tier not in POD_TIERS:
        raise RefusedError(
            f"tier {policy.tier} cannot run as a Kubernetes pod: a pod is isolated by its "
            "container runtime (render with tier container, or gvisor / --gvisor)"
        )
    if policy.network.transparent:
        raise RefusedError(
            "network.transparent cannot be rendered: a pod's traffic is not captured; "
            "the NetworkPolicy lets it reach the proxy only (drop transparent)"
        )
    _check_limits(policy)
    if not opts.image:
        raise PolicyError("give --image REF (or [container] image): the sandbox's image")
    if policy.network.mode == "proxy" and not opts.proxy_image:
        raise PolicyError(
            "give --proxy-image REF: an image with corral installed (it runs corral proxy serve)"
        )
    for secret in policy.secrets.values():
        if secret.kind == "file" and not secret.ref.startswith("/"):
            raise PolicyError(
                f"secrets.{secret.name}: from = file:PATH needs an absolute path in a pod"
            )
    if policy.guardrails.dirs:
        raise RefusedError(
            "[guardrails] dirs name directories on this machine, which the proxy pod "
            "does not have: guardrails are not rendered for Kubernetes yet"
        )
    if policy.tls.upstream_ca:
        raise RefusedError(
            "[tls] upstream_ca names files on this machine, which the proxy pod does not "
            "have: not rendered for Kubernetes yet"
        )
    tls = policy.tls
    if inspects(policy) and (tls.ca_cert or tls.ca == "ephemeral"):
        raise RefusedError(
            "this policy inspects TLS: in Kubernetes the proxy signs with the user CA from "
            f'the Secret {opts.name}-ca; drop [tls] ca_cert, ca_key and ca = "ephemeral"'
        )


# [limits] a pod spec has no field for: refused, never dropped (a render without the
# process limit the policy sets was a pod that could fork without bound)
POD_UNLIMITED = {
    "pids": "a pod's process limit is the node's (the kubelet's --pod-max-pids)",
}


def _check_limits(policy: Policy) -> None:
    for key, why in POD_UNLIMITED.items():
        if getattr(policy.limits, key) is not None:
            raise RefusedError(
                f"[limits] {key} cannot be rendered: {why}; drop it to render this policy"
            )


def inspects(policy: Policy) -> bool:
    """Does the proxy intercept TLS for this policy (secrets, path rules, [tls] inspect)?"""
    if policy.network.mode != "proxy":
        return False
    from corral.net.hooks import chain_for

    return chain_for(policy).may_inspect


def wants_gvisor(policy: Policy, opts: Options) -> bool:
    return opts.gvisor or policy.tier == "gvisor" or policy.container.runtime == "runsc"


# -- seccomp -----------------------------------------------------------------


def seccomp_rules(gvisor: bool) -> tuple[SyscallRule, ...]:
    """corral's deny list, as the container tier applies it under runc or runsc."""
    from corral import seccomp

    rules = seccomp.default_deny_rules()
    if gvisor:
        from corral.tiers.container import gvisor_namespace_rules

        rules = (*(r for r in rules if r.name != "clone3"), *gvisor_namespace_rules())
    return rules


def seccomp_profile(gvisor: bool = False) -> dict[str, object]:
    """The OCI/kubelet seccomp profile (default allow, each rule an errno)."""
    from corral.container import seccomp_oci

    return seccomp_oci.profile(seccomp_rules(gvisor))


# -- small parts -------------------------------------------------------------


def _meta(name: str, opts: Options, role: str = "") -> dict[str, object]:
    meta: dict[str, object] = {"name": name}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    labels = {"app.kubernetes.io/managed-by": "corral", "app.kubernetes.io/part-of": opts.name}
    if role:
        labels[LABEL] = role
    meta["labels"] = labels
    return meta


def _selector(opts: Options, role: str) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": opts.name, LABEL: role}


def _hardened(read_only: bool = True) -> dict[str, object]:
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": read_only,
        "runAsNonRoot": True,
        "runAsUser": USER_ID,
        "runAsGroup": USER_ID,
        "capabilities": {"drop": ["ALL"]},
    }


def _quantity_bytes(n: float) -> str:
    return f"{int(n) >> 20}Mi" if int(n) % (1 << 20) == 0 else str(int(n))


def resources(policy: Policy) -> dict[str, object]:
    """[limits] memory and cpus as limits (and equal requests, so the pod's class is
    Guaranteed when both are set).  Only values the policy itself sets: this host's
    defaults say nothing about a cluster's nodes."""
    lim = policy.limits
    out: dict[str, str] = {}
    if lim.memory is not None:
        out["memory"] = _quantity_bytes(lim.memory)
    if lim.cpus is not None:
        out["cpu"] = f"{round(lim.cpus * 1000)}m"
    if lim.tmp is not None:  # /tmp is an emptyDir on the node's disk
        out["ephemeral-storage"] = _quantity_bytes(lim.tmp * 2)
    return {"limits": out, "requests": dict(out)} if out else {}


def _tmpfs(name: str, size: int | None, memory: bool) -> dict[str, object]:
    src: dict[str, object] = {"medium": "Memory"} if memory else {}
    if size is not None:
        src["sizeLimit"] = _quantity_bytes(size)
    return {"name": name, "emptyDir": src}


def service_env_prefix(opts: Options) -> str:
    """The kubelet's variables for the proxy Service: NAME_PROXY_SERVICE_HOST/_PORT."""
    return (opts.name + "-proxy").upper().replace("-", "_").replace(".", "_")


def proxy_env(opts: Options) -> list[dict[str, object]]:
    """The proxy variables, pointing at the Service's cluster address through the
    variables the kubelet sets for Services that exist when the pod starts: the
    sandbox needs no DNS to find its way out (and has none)."""
    prefix = service_env_prefix(opts)
    host = f"$({prefix}_SERVICE_HOST):$({prefix}_SERVICE_PORT)"
    env: list[dict[str, object]] = []
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):  # as corral.net.door.proxy_env
        for spelled in (name, name.lower()):
            env.append({"name": spelled, "value": f"http://{host}"})
    env.append({"name": "SOCKS_PROXY", "value": f"socks5h://{host}"})
    for name in ("NO_PROXY", "no_proxy"):
        env.append({"name": name, "value": "localhost,127.0.0.1,::1"})
    return env


# -- the sandbox -------------------------------------------------------------


def sandbox_pod_spec(policy: Policy, opts: Options) -> dict[str, object]:
    gvisor = wants_gvisor(policy, opts)
    lim = policy.limits
    env: list[dict[str, object]] = [
        {"name": k, "value": v} for k, v in sorted(policy.env.set_values.items())
    ]
    env += [{"name": "HOME", "value": "/tmp"}, {"name": "CORRAL_SANDBOX", "value": "kubernetes"}]
    mounts: list[dict[str, object]] = [
        {"name": "workspace", "mountPath": WORKSPACE},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "var-tmp", "mountPath": "/var/tmp"},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    workspace: dict[str, object] = (
        {"name": "workspace", "persistentVolumeClaim": {"claimName": opts.workspace_claim}}
        if opts.workspace_claim
        else {"name": "workspace", "emptyDir": {}}
    )
    volumes = [
        workspace,
        _tmpfs("tmp", lim.tmp, memory=False),
        _tmpfs("var-tmp", lim.tmp, memory=False),
        _tmpfs("shm", lim.shm, memory=True),
    ]
    if policy.network.mode == "proxy":
        env += proxy_env(opts)
        if inspects(policy):
            mounts.append(
                {"name": "ca", "mountPath": SANDBOX_CA, "subPath": CA_KEYS[1], "readOnly": True}
            )
            volumes.append(
                {
                    "name": "ca",
                    "secret": {
                        "secretName": f"{opts.name}-ca",
                        "items": [{"key": CA_KEYS[1], "path": CA_KEYS[1]}],
                    },
                }
            )
            env.append({"name": "CORRAL_CA_CERT", "value": SANDBOX_CA})
    container: dict[str, object] = {
        "name": "sandbox",
        "image": opts.image,
        "command": ["sleep", "infinity"],
        "workingDir": WORKSPACE,
        "env": env,
        "volumeMounts": mounts,
        "securityContext": _hardened(),
    }
    res = resources(policy)
    if res:
        container["resources"] = res
    spec: dict[str, object] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": True,  # the proxy's address comes from them
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        # no cluster DNS: names are the proxy's to resolve (a lookup here fails at once)
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": ["127.0.0.1"]},
        "restartPolicy": "Never",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": USER_ID,
            "runAsGroup": USER_ID,
            "fsGroup": USER_ID,
            "seccompProfile": {
                "type": "Localhost",
                "localhostProfile": SECCOMP_GVISOR_PROFILE if gvisor else SECCOMP_PROFILE,
            },
        },
        "containers": [container],
        "volumes": volumes,
    }
    if lim.timeout is not None:
        spec["activeDeadlineSeconds"] = max(1, int(lim.timeout))
    if gvisor:
        spec["runtimeClassName"] = "gvisor"
    return spec


def sandbox_object(policy: Policy, opts: Options) -> dict[str, object]:
    """The Pod, or agent-sandbox's SandboxTemplate or Sandbox around the same spec."""
    spec = sandbox_pod_spec(policy, opts)
    labels = _selector(opts, "sandbox")
    if opts.kind == "pod":
        meta = _meta(f"{opts.name}-sandbox", opts, "sandbox")
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    template = {"metadata": {"labels": labels}, "spec": spec}
    if opts.kind == "template":
        # Unmanaged: agent-sandbox's managed default lets sandboxes reach the public
        # internet; corral's own NetworkPolicy (below) selects these pods instead
        return {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxTemplate",
            "metadata": _meta(f"{opts.name}-sandbox", opts, "sandbox"),
            "spec": {"podTemplate": template, "networkPolicyManagement": "Unmanaged"},
        }
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": _meta(f"{opts.name}-sandbox", opts, "sandbox"),
        "spec": {"podTemplate": template},
    }


def seccomp_config_map(opts: Options) -> dict[str, object]:
    """The profiles, to be copied to each node's kubelet seccomp directory (a pod
    cannot load a Localhost profile from the API; see the README)."""
    from corral.container.seccomp_oci import dumps

    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(f"{opts.name}-seccomp", opts),
        "data": {
            "default.json": dumps(seccomp_profile(False)),
            "gvisor.json": dumps(seccomp_profile(True)),
        },
    }


def runtime_class() -> dict[str, object]:
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "gvisor", "labels": {"app.kubernetes.io/managed-by": "corral"}},
        "handler": "runsc",
    }


# -- the proxy ---------------------------------------------------------------


def proxy_command() -> list[str]:
    """``corral proxy serve`` as cli.cmd_proxy parses it."""
    return [
        "corral",
        "proxy",
        "serve",
        "--listen",
        f"0.0.0.0:{PROXY_PORT}",
        "--policy",
        f"{POLICY_DIR}/{POLICY_KEY}",
        "--workspace",
        PROXY_STATE,
        "--net-log",
        f"{PROXY_STATE}/net.jsonl",
    ]


def secret_names(policy: Policy) -> list[str]:
    """The keys the Secret must hold: each env source's variable, each file source's NAME."""
    return sorted(s.ref if s.kind == "env" else s.name for s in policy.secrets.values())


Objects = list[dict[str, object]]


def _proxy_inputs(policy: Policy, opts: Options) -> tuple[Objects, Objects, Objects]:
    """The proxy container's environment, mounts and the pod's volumes: the policy,
    its state, each secret's source (a reference: values stay in the Secret) and
    the CA where inspection needs one."""
    env: Objects = [
        {"name": "HOME", "value": PROXY_STATE},
        {"name": "XDG_STATE_HOME", "value": PROXY_STATE},
    ]
    mounts: Objects = [
        {"name": "policy", "mountPath": POLICY_DIR, "readOnly": True},
        {"name": "state", "mountPath": PROXY_STATE},
    ]
    volumes: Objects = [
        {"name": "policy", "configMap": {"name": f"{opts.name}-policy"}},
        {"name": "state", "emptyDir": {}},
    ]
    secrets = f"{opts.name}-secrets"
    for s in sorted(policy.secrets.values(), key=lambda s: s.name):
        if s.kind == "env":  # a reference only: the value stays in the Secret
            ref = {"secretKeyRef": {"name": secrets, "key": s.ref}}
            env.append({"name": s.ref, "valueFrom": ref})
        else:
            vol = f"secret-{s.name.lower().replace('_', '-')}"
            volumes.append(
                {
                    "name": vol,
                    "secret": {"secretName": secrets, "items": [{"key": s.name, "path": s.name}]},
                }
            )
            mounts.append({"name": vol, "mountPath": s.ref, "subPath": s.name, "readOnly": True})
    if inspects(policy):
        # the user CA where corral proxy serve looks for it ($XDG_STATE_HOME/corral/ca)
        volumes.append(
            {
                "name": "ca",
                "secret": {
                    "secretName": f"{opts.name}-ca",
                    "defaultMode": 0o440,  # readable through fsGroup only
                    "items": [{"key": k, "path": k} for k in CA_KEYS],
                },
            }
        )
        mounts.append({"name": "ca", "mountPath": PROXY_CA_DIR, "readOnly": True})
    return env, mounts, volumes


def proxy_objects(policy: Policy, policy_text: str, opts: Options) -> Objects:
    name = f"{opts.name}-proxy"
    env, mounts, volumes = _proxy_inputs(policy, opts)
    container = {
        "name": "proxy",
        "image": opts.proxy_image,
        "command": proxy_command(),
        "ports": [{"name": "proxy", "containerPort": PROXY_PORT, "protocol": "TCP"}],
        "env": env,
        "volumeMounts": mounts,
        "securityContext": _hardened(),
        "readinessProbe": {"tcpSocket": {"port": PROXY_PORT}, "periodSeconds": 5},
    }
    labels = _selector(opts, "proxy")
    pod_spec = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": USER_ID,
            "runAsGroup": USER_ID,
            "fsGroup": USER_ID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    policy_map: dict[str, object] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(f"{opts.name}-policy", opts, "proxy"),
        "data": {POLICY_KEY: policy_text},
    }
    deployment: dict[str, object] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, opts, "proxy"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    service: dict[str, object] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, opts, "proxy"),
        "spec": {
            "type": "ClusterIP",
            "selector": labels,
            "ports": [
                {"name": "proxy", "port": PROXY_PORT, "targetPort": PROXY_PORT, "protocol": "TCP"}
            ],
        },
    }
    return [policy_map, service, deployment]


# -- network policies --------------------------------------------------------


def _port_entries(ports: tuple[int, int] | None) -> list[dict[str, object]]:
    if ports is None:
        return []
    lo, hi = ports
    out: list[dict[str, object]] = []
    for proto in ("TCP", "UDP"):
        entry: dict[str, object] = {"protocol": proto, "port": lo}
        if hi != lo:
            entry["endPort"] = hi
        out.append(entry)
    return out


def proxy_egress(policy: Policy) -> list[dict[str, object]]:
    """Where the proxy may connect: the policy's addresses as they are, its names as
    the public internet (a NetworkPolicy cannot match names; the proxy does), and
    the cluster's DNS when some name must be looked up."""
    from corral.net.rules import Rule

    entries = list(policy.network.allow)
    entries += [str(r["host"]) for r in policy.network.rules if r.get("action", "allow") != "deny"]
    rules: list[dict[str, object]] = []
    names = False
    for text in entries:
        rule = Rule(text)
        ports = _port_entries(rule.ports)
        if rule.network is not None:
            peers: list[dict[str, object]] = [{"ipBlock": {"cidr": str(rule.network)}}]
        elif rule.host is not None and rule.host in policy.network.hosts:
            address = policy.network.hosts[rule.host]
            bits = 128 if ":" in address else 32
            peers = [{"ipBlock": {"cidr": f"{address}/{bits}"}}]
        else:
            names = True
            peers = [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(PRIVATE_V4)}},
                {"ipBlock": {"cidr": "::/0", "except": list(PRIVATE_V6)}},
            ]
        rule_out: dict[str, object] = {"to": peers}
        if ports:
            rule_out["ports"] = ports
        if rule_out not in rules:
            rules.append(rule_out)
    if names:
        rules.append(
            {
                "to": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                        },
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    }
                ],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            }
        )
    return rules


def network_policies(policy: Policy, opts: Options) -> list[dict[str, object]]:
    sandbox = _selector(opts, "sandbox")
    proxy = _selector(opts, "proxy")
    port = [{"protocol": "TCP", "port": PROXY_PORT}]
    egress: list[dict[str, object]] = []
    if policy.network.mode == "proxy":
        egress = [{"to": [{"podSelector": {"matchLabels": proxy}}], "ports": port}]
    out: list[dict[str, object]] = [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _meta(f"{opts.name}-sandbox", opts, "sandbox"),
            "spec": {
                "podSelector": {"matchLabels": sandbox},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [],
                "egress": egress,
            },
        }
    ]
    if policy.network.mode == "proxy":
        out.append(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": _meta(f"{opts.name}-proxy", opts, "proxy"),
                "spec": {
                    "podSelector": {"matchLabels": proxy},
                    "policyTypes": ["Ingress", "Egress"],
                    "ingress": [
                        {"from": [{"podSelector": {"matchLabels": sandbox}}], "ports": port}
                    ],
                    "egress": proxy_egress(policy),
                },
            }
        )
    return out


# -- everything --------------------------------------------------------------


def render(policy: Policy, policy_text: str, opts: Options) -> list[dict[str, object]]:
    """Every object, in an order ``kubectl apply`` can take: the Service before the
    sandbox (its variables are set only for Services that exist when a pod starts)."""
    check(policy, opts)
    objects: list[dict[str, object]] = []
    if wants_gvisor(policy, opts):
        objects.append(runtime_class())
    objects.append(seccomp_config_map(opts))
    objects += network_policies(policy, opts)
    if policy.network.mode == "proxy":
        objects += proxy_objects(policy, policy_text, opts)
    objects.append(sandbox_object(policy, opts))
    return objects


def as_list(objects: list[dict[str, object]]) -> dict[str, object]:
    """One ``v1`` List, which ``kubectl apply -f`` takes as it takes a file of many."""
    return {"apiVersion": "v1", "kind": "List", "items": objects}
