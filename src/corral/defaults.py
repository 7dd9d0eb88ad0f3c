"""Built-in lists every tier applies unless a policy sets ``[filesystem] defaults = false``.

Entries ending in ``/`` are directories; the rest are files.  The distinction
matters only for paths that do not exist yet, where the mask has to be made
with the right shape.
"""

from __future__ import annotations

POLICY_FILENAME = "corral.toml"
OUTPUT_LIMIT = 64 << 20  # bytes of stdout+stderr kept per run by default

# The launcher's environment is not inherited: only these names, plus what the
# policy lists under [env].
BASE_ENV = ("PATH", "HOME", "LANG", "TERM", "TZ", "USER")
FALLBACK_PATH = "/usr/local/bin:/usr/bin:/bin"

# Where tools find extra certificate authorities (a company's TLS-inspecting
# proxy, a private registry's CA).  A path to a bundle is no secret, and without
# it every download fails verification: these pass by default, when set.
CA_ENV = (
    "SSL_CERT_FILE",  # OpenSSL and everything on it: Python's ssl, Ruby, Go, curl
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",  # Node, npm
    "REQUESTS_CA_BUNDLE",  # requests, pip's vendored copy
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "AWS_CA_BUNDLE",
    "CARGO_HTTP_CAINFO",
    "NPM_CONFIG_CAFILE",
    "npm_config_cafile",
    "YARN_HTTPS_CA_FILE_PATH",
    "DENO_CERT",
    "BUNDLE_SSL_CA_CERT",
    "NIX_SSL_CERT_FILE",
    "HTTPLIB2_CA_CERTS",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
)

# Registry settings whose values can carry a token (https://user:TOKEN@host/...).
# Like every name not listed above they pass only when named ([env] pass or
# --env); listed here so that stays so, and tested.
REGISTRY_ENV = (
    "NPM_CONFIG_REGISTRY",
    "npm_config_registry",
    "YARN_NPM_REGISTRY_SERVER",
    "YARN_REGISTRY",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
    "UV_INDEX_URL",
    "UV_EXTRA_INDEX_URL",
    "UV_INDEX",
    "UV_DEFAULT_INDEX",
    "GOPROXY",
    "BUNDLE_MIRROR__ALL",
)

# Secrets under the user's home.  Masked even where the path does not exist
# yet, so a key written there after launch stays hidden.  Everything here lives
# directly in ~ or ~/.config, so one snapshot of each covers all missing ones.
READ_DENY_HOME = (
    # keys and cloud credentials
    "~/.ssh/",
    "~/.aws/",
    "~/.azure/",
    "~/.config/gcloud/",
    "~/.oci/",
    "~/.config/doctl/",
    "~/.kube/",
    "~/.docker/",
    "~/.dockercfg",  # docker's older registry credentials (copied into the home layer)
    "~/.gnupg/",
    "~/.password-store/",
    "~/.vault-token",
    "~/.terraform.d/",
    "~/.s3cfg",
    "~/.boto",
    "~/.config/rclone/",
    # forges, package registries and their tokens
    "~/.netrc",
    "~/.git-credentials",
    "~/.config/git/credentials",
    "~/.config/gh/",
    "~/.config/hub",
    "~/.config/glab-cli/",
    "~/.npmrc",
    "~/.yarnrc.yml",
    "~/.pypirc",
    "~/.config/pip/",
    "~/.pip/",  # pip's legacy per-user config (pip.conf: index-url with a token)
    "~/.yarnrc",  # yarn 1: registry settings and _authToken
    "~/.bunfig.toml",  # bun: registry tokens
    "~/.condarc",  # conda: channel URLs with tokens
    "~/.config/composer/auth.json",
    # databases
    "~/.pgpass",
    "~/.my.cnf",
    # other agents' and tools' tokens
    "~/.config/anthropic/",
    "~/.claude/",
    "~/.claude.json",
    "~/.codex/",
    "~/.config/op/",
    "~/.ngrok2/",
    "~/.config/ngrok/",
    "~/.gemini/",  # Gemini CLI: OAuth credentials
    "~/.config/github-copilot/",  # Copilot's OAuth tokens (hosts.json, apps.json)
    "~/.config/configstore/",  # npm-published CLIs' tokens (firebase-tools...)
    "~/.config/.wrangler/",  # Cloudflare's wrangler: OAuth token
    "~/.wrangler/",  # (its older place)
    "~/.fly/",  # fly.io: access token
    "~/.databrickscfg",
    "~/.huggingface/",  # (Hugging Face's older token place)
    "~/.config/solana/",  # Solana CLI keypairs (id.json)
    "~/.electrum/",  # Electrum wallets
    "~/.Xauthority",  # the X server's cookie: a program holding it controls the display
    # browser profiles hold session cookies
    "~/.mozilla/",
    "~/.thunderbird/",  # mail profiles: account passwords and session cookies
    "~/.config/google-chrome/",
    "~/.config/chromium/",
    # shell history often holds pasted tokens
    "~/.bash_history",
    "~/.zsh_history",
    "~/.python_history",
    "~/.psql_history",
    "~/.mysql_history",
    "~/.node_repl_history",
    "~/.lesshst",
)

# Masked when they exist at launch.  These live deeper in directories that
# would each need a snapshot of their own to cover a missing file, which costs
# a bind per entry on every run; they are created by deliberate logins, not
# in the middle of an agent's run.  Also host-wide secrets that root inside a
# user namespace could otherwise read.
READ_DENY_IF_PRESENT = (
    "~/.gem/credentials",
    "~/.cargo/credentials",
    "~/.cargo/credentials.toml",
    "~/.m2/settings.xml",
    "~/.m2/settings-security.xml",
    "~/.gradle/gradle.properties",
    "~/.nuget/NuGet/NuGet.Config",
    "~/.local/share/keyrings/",
    "~/.cache/huggingface/token",  # Hugging Face's access token
    "~/.pulumi/credentials.json",  # Pulumi's access tokens
    "~/.ethereum/keystore/",  # geth's encrypted account keys (the chain data stays readable)
    "~/.config/sops/age/keys.txt",  # age private keys sops decrypts with
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/shadow-",
    "/etc/gshadow-",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssh/ssh_host_dsa_key",
)

# Where the launcher's environment moves a secret the lists above name under ~
# (a tool reads its credentials from there instead): each variable, and what is
# denied at its value when present.  "" is the path itself (a file), "/" the path
# itself as a directory, anything else a file under it.  KUBECONFIG is a list
# (``:``).  XDG_CONFIG_HOME moves every ``~/.config/`` entry above (corral.policy).
READ_DENY_ENV: dict[str, tuple[str, ...]] = {
    "GNUPGHOME": ("/",),  # gpg's private keys
    "PASSWORD_STORE_DIR": ("/",),  # pass
    "DOCKER_CONFIG": ("/",),  # config.json: registry auths
    "AZURE_CONFIG_DIR": ("/",),  # az's tokens
    "CLOUDSDK_CONFIG": ("/",),  # gcloud's credentials
    "GH_CONFIG_DIR": ("/",),  # gh's hosts.yml: OAuth token
    "KUBECONFIG": ("",),  # cluster credentials
    "AWS_SHARED_CREDENTIALS_FILE": ("",),
    "AWS_CONFIG_FILE": ("",),  # (may hold keys and a credential_process)
    "GOOGLE_APPLICATION_CREDENTIALS": ("",),  # a service account's private key
    "NPM_CONFIG_USERCONFIG": ("",),  # the user's .npmrc: _authToken
    "npm_config_userconfig": ("",),
    "PIP_CONFIG_FILE": ("",),  # index-url with a token
    "RCLONE_CONFIG": ("",),  # remotes' credentials
    "SOPS_AGE_KEY_FILE": ("",),  # age private keys
    "HF_TOKEN_PATH": ("",),  # Hugging Face's access token
    "HF_HOME": ("token",),
    "CARGO_HOME": ("credentials", "credentials.toml"),  # crates.io token
    "GRADLE_USER_HOME": ("gradle.properties",),  # repository passwords
}

# Secrets inside the workspace, found by name at launch (nested directories too).
READ_DENY_WORKSPACE_NAMES = (".env", ".envrc.local", ".netrc", ".npmrc", ".pypirc")
# ``.env.<anything>`` is a secret too, except these templates that are meant to be read.
ENV_TEMPLATES = (".env.example", ".env.sample", ".env.template", ".env.dist", ".env.defaults")

# Files a login or interactive shell reads (and runs) when it starts.
SHELL_STARTUP = (
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
)

# Relative to the workspace root.  Every git directory found in the workspace
# (nested repositories and submodules under .git/modules included) also gets
# GITDIR_WRITE_DENY.  Writing
# any of these would let the sandbox run code later, outside the sandbox.
WRITE_DENY_WORKSPACE = (
    ".vscode/",
    ".idea/",
    ".devcontainer/",
    # agent tools' project settings: hooks, permissions and MCP servers they run
    # (unsandboxed) the next time they start here, and commands they offer
    ".claude/",
    ".mcp.json",
    ".cursor/",
    ".gemini/",
    ".zed/",
    ".aider.conf.yml",
    # (not .gitmodules, .gitconfig or .ripgreprc, which srt also protects: content a
    # clone brings, read only when included or named; a translated srt policy adds them)
    ".envrc",
    *SHELL_STARTUP,
)

# (commondir: a file there makes git read config and hooks from the directory it
# names, one the run could fill)
GITDIR_WRITE_DENY = ("hooks/", "config", "config.worktree", "commondir")

# Directories the workspace scan does not descend into: huge, and not where a
# repository or a secret file is expected.
SCAN_SKIP_DIRS = frozenset({"node_modules", ".venv", "venv", "__pycache__", ".tox", "target"})
# Of those, the environments installers fill with hard links into their caches
# (uv, pnpm, bun): corral.linkfarm looks at them package by package instead.
LINK_FARMS = frozenset({".venv", "venv", ".tox", "node_modules"})
# Set inside unless passed or set: uv run in the sandbox copies from its cache
# (the home layer's) instead of linking, so the environment it makes is not
# read-only to the next run (corral.linkfarm).  Not pnpm's
# npm_config_package_import_method: npm warns of it on every command, and pnpm
# needs no help (across the mounts of the namespace, container and microvm
# tiers its links fail and it copies; on landlock its copy's chmod is allowed in the
# writable places).
INSTALLER_ENV = {"UV_LINK_MODE": "copy"}
SCAN_MAX_DEPTH = 6
SCAN_MAX_ENTRIES = 20000

# Files in the workspace with more than one link may share their content with a
# file outside it.  At most this many are made read-only one by one; more are
# refused rather than left writable.
HARDLINK_MAX = 1000
# When hard-linked files are found: how many entries of the secret paths are
# looked at to tell whether one of them is a link to a secret.
SECRET_WALK_MAX = 5000
HARDLINK_POLICIES = ("read-only", "refuse")

# [filesystem] home: where writes under ~ go (corral.home); the first is the default.
HOME_MODES = ("persist", "ephemeral", "read-only")
