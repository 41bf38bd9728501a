"""``ceiling deploy VARIANT``: the variant (a sweep's winner) as a persistent service.

Two renderings of the same launch, both from what ``ceiling launch`` would run (the engine
adapter's command line for the installed engine, the variant's flags, environment, model, port):

- a systemd unit: ``ExecStartPre`` runs ceiling's safe /dev/shm clean-up (``ceiling shm --apply``:
  only segments no live process has open), ``ExecStart`` the engine, ``ExecStartPost`` waits for
  readiness (``ceiling ready``: the engine's health endpoints answer 200; until then the unit is
  "activating" and ``systemctl start`` blocks), ``Restart=always`` with a start-rate limit, the
  tuned ``Environment=``, ``LimitNOFILE``, logs to the journal under ``SyslogIdentifier``;
- a Docker Compose service with a healthcheck on the same endpoints, ``ipc: host`` when
  tensor-parallel ranks share memory, the model mounted read-only, the port published on the
  variant's host address.

Secrets are never written into either: variables whose names look secret, or whose values hold
one whatever the name (a mirror URL with its ``user:password``), go to an env file
(``EnvironmentFile=`` / ``env_file:``) that the user fills in; a secret flag value in the
variant's arguments (by the flag's name or by its value) is refused. An argument that is an inline script (vLLM CPU's metadata shim,
``python -c ...``) is written to a file beside the unit, since a unit line cannot hold newlines.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, Field

from ceiling.engines import get_engine
from ceiling.envcheck.check import env_data
from ceiling.errors import CeilingError
from ceiling.redact import holds_secret, is_secret_name

if TYPE_CHECKING:
    from ceiling.engines.base import Engine
    from ceiling.engines.variant import Variant

SCHEMA_VERSION = 1


class DeployFile(BaseModel):
    """One file of the deployment: where it goes and what it holds."""

    path: str
    content: str
    mode: int = 0o644


class DeployPlan(BaseModel):
    """Everything ``deploy`` writes (or prints in a dry run)."""

    schema_version: int = SCHEMA_VERSION
    variant: str
    engine: str
    service: str  # unit / compose service name
    url: str
    health_paths: list[str]
    unit: DeployFile
    compose: DeployFile
    env_file: DeployFile
    scripts: list[DeployFile] = Field(default_factory=list)
    secrets: list[str] = Field(default_factory=list)  # variable names expected in the env file
    image: str | None = None
    notes: list[str] = Field(default_factory=list)


def _secret(name: str, value: str = "") -> bool:
    return is_secret_name(name) or holds_secret(value)


def service_name(variant: Variant) -> str:
    return "ceiling-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", variant.name).strip("-")


def systemd_quote(arg: str) -> str:
    """One word of an ``Exec*=`` line: specifiers (``%``) and variables (``$``) escaped, quoted
    when it holds blanks or quotes (systemd.service(5), "Command lines")."""
    text = arg.replace("%", "%%").replace("$", "$$")
    if text and not re.search(r"[\s\"'\\;]", text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _env_line(name: str, value: str) -> str:
    text = f"{name}={value}".replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')
    return f'Environment="{text}"'


def _ceiling_cmd(*args: str) -> list[str]:
    """ceiling run by the Python that runs this command (a unit needs absolute paths)."""
    return [sys.executable, "-m", "ceiling", *args]


def _split_inline_scripts(
    argv: list[str], out_dir: Path, service: str
) -> tuple[list[str], list[DeployFile]]:
    """``python -c SCRIPT`` -> ``python FILE`` with SCRIPT written to FILE beside the unit."""
    files: list[DeployFile] = []
    result: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "-c" and i + 1 < len(argv) and "\n" in argv[i + 1]:
            path = (out_dir / f"{service}-launch.py").resolve()
            files.append(DeployFile(path=str(path), content=argv[i + 1]))
            result.append(str(path))
            i += 2
            continue
        result.append(argv[i])
        i += 1
    return result, files


def build_plan(
    variant: Variant,
    out_dir: Path,
    image: str | None = None,
    gpus: int | None = None,
    ready_timeout_s: int = 1800,
    env_file: Path | None = None,
) -> DeployPlan:
    """Render the unit and the compose service of ``variant`` (nothing is written here)."""
    engine = get_engine(variant.engine)
    install = engine.locate(variant)
    port = variant.port or engine.default_port
    plan = engine.launch_command(variant, install, port)
    head = len(engine.server_argv(install))
    user = variant.argv()
    for i, tok in enumerate(user):
        name = tok.split("=", 1)[0]
        if tok.startswith("-") and _secret(name) and (("=" in tok) or i + 1 < len(user)):
            raise CeilingError(
                f"{variant.name}: {name} carries a secret on the command line; a unit or compose "
                "file would hold it in clear",
                fix=f"remove {name} from the variant and give the engine its key through the "
                f"environment ({' / '.join(engine.api_key_env) or 'its key variable'}) in the env "
                "file deploy references",
            )
        if holds_secret(tok):  # never echo the value: name the flag it belongs to
            before = user[i - 1] if i > 0 else ""
            flag = (
                name if tok.startswith("-") else before if before.startswith("-") else "an argument"
            )
            raise CeilingError(
                f"{variant.name}: the value of {flag} holds a credential (a URL's user:password "
                "or a secret query value); a unit or compose file would hold it in clear",
                fix=f"give {flag} a value without credentials, and the credential to the engine "
                "through a variable of the variant's env (deploy moves it to the env file)",
            )
    service = service_name(variant)
    out_dir = out_dir.resolve()
    env_path = (env_file or out_dir / f"{service}.env").resolve()
    secrets = sorted(k for k, v in variant.env.items() if _secret(k, v))
    tuned = {k: v for k, v in {**variant.env, **plan.env}.items() if not _secret(k, v)}
    tuned.setdefault("NO_COLOR", "1")
    health = list(engine.health_paths)
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(variant.host, variant.host)
    url = f"http://{host}:{port}"
    argv, scripts = _split_inline_scripts(plan.argv, out_dir, service)
    model_path = variant.model_path()
    notes = list(plan.notes)
    if secrets:
        notes.append(
            f"secret variable(s) {', '.join(secrets)} were NOT copied: set them in {env_path}"
        )
    tp = engine.tensor_parallel(variant)
    if gpus is None:  # from the variant, not from the install found here
        gpus = engine.gpus_for(variant)

    nofile = env_data().nofile.target
    unit = _unit(
        variant, engine, service, argv, tuned, env_path, url, health, ready_timeout_s, nofile
    )
    image = image or engine.image_for(install)
    if image is None:
        raise CeilingError(
            f"no published {engine.display_name} image is known for this install "
            f"({install.dist or engine.name} {install.version or ''})".replace(" )", ")"),
            fix="name the image to run with --image (one that has the engine installed)",
        )
    compose = _compose(
        variant,
        engine,
        service,
        plan.argv[head:],
        tuned,
        env_path,
        port,
        health,
        image,
        model_path,
        gpus,
        tp,
        ready_timeout_s,
        nofile,
    )
    env_text = (
        f"# Secrets for {service} (systemd EnvironmentFile= and compose env_file:).\n"
        "# One NAME=value per line; keep this file mode 600. deploy never writes values here.\n"
        + "".join(f"# {k}=\n" for k in secrets)
    )
    return DeployPlan(
        variant=variant.name,
        engine=engine.name,
        service=service,
        url=url,
        health_paths=health,
        unit=DeployFile(path=str(out_dir / f"{service}.service"), content=unit),
        compose=DeployFile(path=str(out_dir / "compose.yaml"), content=compose),
        env_file=DeployFile(path=str(env_path), content=env_text, mode=0o600),
        scripts=scripts,
        secrets=secrets,
        image=image,
        notes=notes,
    )


def _unit(
    variant: Variant,
    engine: Engine,
    service: str,
    argv: list[str],
    env: dict[str, str],
    env_path: Path,
    url: str,
    health: list[str],
    ready_timeout_s: int,
    nofile: int,
) -> str:
    ready = _ceiling_cmd(
        "ready", "--url", url, "--ready-timeout", str(ready_timeout_s), "--pid", "$MAINPID"
    )
    ready += [tok for p in health for tok in ("--path", p)]
    ready_line = " ".join(systemd_quote(a) if a != "$MAINPID" else "$MAINPID" for a in ready)
    lines = [
        "# Written by `ceiling deploy` from the variant "
        f"{variant.source or variant.name}; "
        f"`ceiling deploy {variant.source or 'VARIANT.yaml'} --dry-run` prints it again.",
        "[Unit]",
        f"Description=ceiling: {variant.name} ({engine.display_name} serving {variant.served_model_name or variant.model})",
        "After=network-online.target",
        "Wants=network-online.target",
        # at most 5 starts in 10 minutes: a broken model or flag does not loop forever
        "StartLimitIntervalSec=600",
        "StartLimitBurst=5",
        "",
        "[Service]",
        "Type=exec",
        f"WorkingDirectory={systemd_quote(str(Path(variant.source).parent if variant.source else Path.cwd()))}",
        *[_env_line(k, v) for k, v in sorted(env.items())],
        f"EnvironmentFile=-{env_path}",
        # removes only /dev/shm segments that no live process has open or mapped
        "ExecStartPre=" + " ".join(systemd_quote(a) for a in _ceiling_cmd("shm", "--apply")),
        "ExecStart=" + " ".join(systemd_quote(a) for a in argv),
        # the unit is "activating" until the engine's health endpoints answer 200
        "ExecStartPost=" + ready_line,
        f"TimeoutStartSec={ready_timeout_s + 60}",
        "TimeoutStopSec=60",
        "KillMode=control-group",
        "Restart=always",
        "RestartSec=5",
        f"LimitNOFILE={nofile}",
        "StandardOutput=journal",
        "StandardError=journal",
        f"SyslogIdentifier={service}",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def _compose_escape(value: str) -> str:
    return value.replace("$", "$$")


def _compose(
    variant: Variant,
    engine: Engine,
    service: str,
    args: list[str],
    env: dict[str, str],
    env_path: Path,
    port: int,
    health: list[str],
    image: str,
    model_path: Path | None,
    gpus: int,
    tp: int,
    ready_timeout_s: int,
    nofile: int,
) -> str:
    args = list(args)
    for i, tok in enumerate(args):  # inside the container the server listens on all interfaces
        if tok == "--host" and i + 1 < len(args):
            args[i + 1] = "0.0.0.0"
    probe = f"http://127.0.0.1:{port}{health[0]}"
    if engine.container_health_tool == "curl":
        test = ["CMD", "curl", "-fsS", "-o", "/dev/null", probe]
    else:
        test = [
            "CMD",
            "python3",
            "-c",
            f"import urllib.request; urllib.request.urlopen('{probe}', timeout=5)",
        ]
    svc: dict[str, Any] = {"image": image}
    if engine.container_entrypoint:
        svc["entrypoint"] = list(engine.container_entrypoint)
    svc["command"] = [_compose_escape(a) for a in args]
    svc["environment"] = {k: _compose_escape(v) for k, v in sorted(env.items())}
    svc["env_file"] = [str(env_path)]
    bind = variant.host if variant.host not in ("", "0.0.0.0") else "0.0.0.0"
    svc["ports"] = [f"{bind}:{port}:{port}"]
    if model_path is not None:
        mount = model_path.parent if model_path.is_file() or model_path.suffix else model_path
        svc["volumes"] = [f"{mount}:{mount}:ro"]
    if tp > 1:
        svc["ipc"] = "host"  # NCCL's shared-memory transport between the TP ranks
    svc["ulimits"] = {"nofile": {"soft": nofile, "hard": nofile}}
    svc["restart"] = "unless-stopped"
    svc["healthcheck"] = {
        "test": test,
        "interval": "30s",
        "timeout": "10s",
        "retries": 3,
        "start_period": f"{ready_timeout_s}s",
    }
    if gpus:
        svc["deploy"] = {
            "resources": {
                "reservations": {
                    "devices": [{"driver": "nvidia", "count": gpus, "capabilities": ["gpu"]}]
                }
            }
        }
    header = (
        f"# Written by `ceiling deploy` from the variant {variant.source or variant.name}.\n"
        f"# Secrets: {env_path} (env_file), never inline. Validate: docker compose config\n"
    )
    return header + yaml.safe_dump({"services": {service: svc}}, sort_keys=False, width=1000)
