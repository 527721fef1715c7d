"""Checks the deployment files in deploy/ and the Dockerfile without running them: every manifest
parses, and what one file names another file must have (ports, names, labels, paths, volumes,
config keys, timeouts).

usage: check_manifests.py SOURCE_DIR DUET_BINARY ROUTES_OUT

Writes the HTTP routes the probes and health checks use, one per line, to ROUTES_OUT (the caller
asks a live server for them). Exits 1 naming each problem. No Docker daemon or Kubernetes cluster
is needed (none runs where the tests run): this is what can be checked without one.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
import sys

import yaml

problems: list[str] = []
routes: set[str] = set()


def check(ok: bool, message: str) -> None:
    if not ok:
        problems.append(message)


def load_all(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def config_of(text: str, where: str, duet: str) -> dict:
    """A duet.yaml: parsed, and every key one `duet serve` knows (the server refuses unknown keys;
    its --help lists the flags, whose names the keys take with underscores)."""
    cfg = yaml.safe_load(text)
    help_text = subprocess.run([duet, "serve", "--help"], capture_output=True, text=True).stdout
    flags = set(re.findall(r"--([a-z][a-z0-9-]*)", help_text))
    for key in cfg:
        check(key.replace("_", "-") in flags, f"{where}: '{key}' is not a setting of duet serve")
    return cfg


# --- Kubernetes ----------------------------------------------------------------------------------
def check_k8s(src: str, duet: str) -> None:
    d = os.path.join(src, "deploy", "k8s")
    kust = yaml.safe_load(open(os.path.join(d, "kustomization.yaml")))
    files = sorted(f for f in os.listdir(d) if f.endswith(".yaml") and f != "kustomization.yaml")
    check(sorted(kust["resources"]) == files, f"kustomization.yaml lists {kust['resources']}, the folder has {files}")
    docs: dict[str, dict] = {}
    for f in files:
        for doc in load_all(os.path.join(d, f)):
            for key in ("apiVersion", "kind", "metadata"):
                check(key in doc, f"k8s/{f}: no {key}")
            docs[doc["kind"]] = doc
    for kind in ("Deployment", "Service", "ServiceMonitor", "ConfigMap", "PersistentVolumeClaim"):
        check(kind in docs, f"deploy/k8s has no {kind}")
    dep, svc, mon, cm, pvc = (docs[k] for k in ("Deployment", "Service", "ServiceMonitor", "ConfigMap",
                                               "PersistentVolumeClaim"))
    pod = dep["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    check(dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items(),
          "the Deployment's selector does not match its pod template's labels")
    check(svc["spec"]["selector"].items() <= pod_labels.items(), "the Service's selector does not match the pods")
    check(mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items(),
          "the ServiceMonitor's selector does not match the Service's labels")
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    for name, p in svc_ports.items():
        check(p["targetPort"] in ports or p["targetPort"] in ports.values(),
              f"Service port {name} targets {p['targetPort']}, which the container does not expose")
    for ep in mon["spec"]["endpoints"]:
        check(ep["port"] in svc_ports, f"the ServiceMonitor scrapes port '{ep['port']}', which the Service lacks")
        check(ep.get("path") == "/metrics", f"the ServiceMonitor scrapes {ep.get('path')}, not /metrics")
        routes.add(ep["path"])
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        check(probe in container, f"the container has no {probe}")
        if probe in container:
            get = container[probe]["httpGet"]
            check(get["port"] in ports or get["port"] in ports.values(), f"{probe} uses port {get['port']}, not exposed")
            routes.add(get["path"])
    check(container["livenessProbe"]["httpGet"]["path"] == "/health", "the liveness probe is not /health")
    res = container.get("resources", {})
    check("requests" in res and "limits" in res and "memory" in res.get("limits", {}),
          "the container needs resource requests and a memory limit")
    # Volumes: each mount names a volume; the config volume is the ConfigMap, the models the PVC.
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    for name in mounts:
        check(name in volumes, f"the container mounts volume '{name}', which the pod does not define")
    cm_volumes = [v for v in volumes.values() if "configMap" in v]
    pvc_volumes = [v for v in volumes.values() if "persistentVolumeClaim" in v]
    check(len(cm_volumes) == 1 and cm_volumes[0]["configMap"]["name"] == cm["metadata"]["name"],
          "the pod's configMap volume does not name the ConfigMap")
    check(len(pvc_volumes) == 1 and pvc_volumes[0]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"],
          "the pod's PVC volume does not name the PersistentVolumeClaim")
    # The command reads the ConfigMap's duet.yaml where it is mounted.
    cmd = container["command"] + container.get("args", [])
    check(cmd[:2] == ["duet", "serve"] and "--config" in cmd, f"the container runs {cmd}, not duet serve --config")
    config_path = cmd[cmd.index("--config") + 1]
    cm_mount = mounts[cm_volumes[0]["name"]]["mountPath"]
    check(os.path.dirname(config_path) == cm_mount and os.path.basename(config_path) in cm["data"],
          f"--config {config_path} is not a key of the ConfigMap mounted at {cm_mount}")
    cfg = config_of(cm["data"]["duet.yaml"], "ConfigMap duet.yaml", duet)
    check(cfg.get("port") in ports.values(), f"duet.yaml's port {cfg.get('port')} is not the container port {ports}")
    check(cfg.get("host") == "0.0.0.0", "duet.yaml must listen on 0.0.0.0 in a pod")
    models_mount = mounts[pvc_volumes[0]["name"]]["mountPath"]
    check(str(cfg.get("model", "")).startswith(models_mount + "/"),
          f"duet.yaml's model {cfg.get('model')} is not on the models volume ({models_mount})")
    grace = pod["spec"].get("terminationGracePeriodSeconds")
    timeout = cfg.get("shutdown_timeout", 30)
    check(grace is not None and timeout < grace <= timeout + 10,
          f"terminationGracePeriodSeconds {grace} does not match shutdown_timeout {timeout} (a few seconds more)")
    sc = container.get("securityContext", {})
    check(sc.get("allowPrivilegeEscalation") is False and pod["spec"]["securityContext"].get("runAsNonRoot"),
          "the pod must run as non-root without privilege escalation")
    with open(os.path.join(os.environ["WORK"], "k8s-duet.yaml"), "w") as f:
        f.write(cm["data"]["duet.yaml"])


# --- Dockerfile ----------------------------------------------------------------------------------
def dockerfile_instructions(path: str) -> list[tuple[str, str]]:
    text = open(path, encoding="utf-8").read().replace("\\\n", " ")
    out = []
    for line in text.split("\n"):
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def debian_packages_of(binary: str) -> set[str]:
    """The Debian packages that hold the shared libraries `binary` links (dpkg -S on this machine,
    one call for all of them: each call reads dpkg's whole database)."""
    out = set()
    ldd = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = re.findall(r"=> (/\S+)", ldd)
    paths = sorted({p for lib in libs for p in (os.path.realpath(lib), lib)})
    owners = {}
    listing = subprocess.run(["dpkg", "-S", *paths], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        pkgs, sep, path = line.rpartition(": ")
        if sep:
            owners[path.strip()] = pkgs.split(",")[0].split(":")[0].strip()
    for lib in libs:
        owner = owners.get(os.path.realpath(lib)) or owners.get(lib)
        if owner:
            out.add(owner)
        else:
            problems.append(f"cannot tell which Debian package holds {lib}")
    return out


def check_dockerfile(src: str, duet: str) -> tuple[int, str]:
    ins = dockerfile_instructions(os.path.join(src, "Dockerfile"))
    froms = [rest for word, rest in ins if word == "FROM"]
    check(len(froms) >= 2, "the Dockerfile is not multi-stage")
    for f in froms:
        image = f.split()[0]
        check(image.startswith("debian:12") or image.startswith("debian:bookworm"), f"FROM {image}: not Debian 12")
        check(":" in image and not image.endswith(":latest"), f"FROM {image}: pin a tag")
    stages = [f.split()[-1] for f in froms if " AS " in f.upper()]
    for word, rest in ins:
        if word == "COPY" and rest.startswith("--from="):
            check(rest.split()[0].split("=")[1] in stages, f"COPY {rest}: no such stage")
        elif word == "COPY":
            for p in shlex.split(rest)[:-1]:
                check(os.path.exists(os.path.join(src, p)), f"COPY {p}: not in the repository")
        if word == "RUN" and "apt-get install" in rest:
            check("apt-get update" in rest, "apt-get install without apt-get update in the same RUN")
            check("--no-install-recommends" in rest and " -y" in rest, "apt-get install needs -y --no-install-recommends")
            check("rm -rf /var/lib/apt/lists/*" in rest, "apt-get install without removing /var/lib/apt/lists")
        check(not (word == "RUN" and re.search(r"\b(curl|wget)\b.*\|\s*(ba)?sh", rest)), "RUN pipes a download into a shell")
        check(word != "ADD", "use COPY, not ADD")
    runtime = [rest for word, rest in ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM"):] if word == "RUN"]
    runtime_pkgs = set(" ".join(runtime).split())
    build_pkgs = set(" ".join(rest for word, rest in ins if word == "RUN").split()) - runtime_pkgs
    # Runtime: every library the binary links comes from a package the image installs.
    for pkg in sorted(debian_packages_of(duet) - {"libc6", "libgcc-s1"}):
        check(pkg in runtime_pkgs, f"the runtime stage does not install {pkg}, which duet links")
    # Build: the -dev packages install-deps.sh installs for building (not the tests').
    deps = open(os.path.join(src, "scripts", "install-deps.sh")).read()
    for pkg in re.findall(r"\b(\S+-dev)\b", deps):
        if pkg in ("libgtest-dev", "libgmock-dev", "libclang-rt-14-dev"):  # tests and fuzzers only
            continue
        check(pkg in build_pkgs, f"the build stage does not install {pkg} (scripts/install-deps.sh does)")
    users = [rest for word, rest in ins if word == "USER"]
    check(users and users[-1] not in ("root", "0"), "the image must end as a non-root USER")
    health = " ".join(rest for word, rest in ins if word == "HEALTHCHECK")
    m = re.search(r"http://127\.0\.0\.1:(\d+)(/\S*)", health)
    check(m is not None, "no HEALTHCHECK with an http://127.0.0.1 route")
    entry = [rest for word, rest in ins if word == "ENTRYPOINT"]
    entry_args = yaml.safe_load(entry[-1]) if entry else []
    port = int(entry_args[entry_args.index("--port") + 1]) if "--port" in entry_args else 8000
    expose = [int(p) for word, rest in ins if word == "EXPOSE" for p in rest.split()]
    check(port in expose, f"EXPOSE {expose} does not include duet's --port {port}")
    if m:
        check(int(m.group(1)) == port, f"HEALTHCHECK asks port {m.group(1)}, duet listens on {port}")
        routes.add(m.group(2))
    volumes = " ".join(rest for word, rest in ins if word == "VOLUME")
    cmd = yaml.safe_load([rest for word, rest in ins if word == "CMD"][-1])
    check("/models" in volumes and cmd[cmd.index("--model") + 1].startswith("/models/"),
          "the model must be a VOLUME at /models that CMD's --model reads")
    ignore = open(os.path.join(src, ".dockerignore")).read().split()
    for needed in ("src", "cmake", "CMakeLists.txt"):
        check(needed not in ignore, f".dockerignore excludes {needed}, which the build copies")
    return port, " ".join(entry_args)


# --- compose -------------------------------------------------------------------------------------
def check_compose(src: str, duet_port: int) -> None:
    d = os.path.join(src, "deploy")
    c = yaml.safe_load(open(os.path.join(d, "compose.yaml")))
    services = c["services"]
    for name in ("duet", "redis", "prometheus", "grafana"):
        check(name in services, f"compose.yaml has no service {name}")
    named_volumes = set(c.get("volumes", {}) or {})
    mounts: dict[str, dict[str, str]] = {}
    for name, s in services.items():
        check("image" in s or "build" in s, f"service {name} has neither image nor build")
        if "image" in s and "build" not in s:
            check(":" in s["image"] and not s["image"].endswith(":latest"), f"service {name}: pin the image tag")
        for dep in s.get("depends_on", []):
            check(dep in services, f"service {name} depends on {dep}, which does not exist")
        mounts[name] = {}
        for v in s.get("volumes", []):
            host, target = v.split(":")[:2]
            mounts[name][target] = host
            if host.startswith("."):
                if not (name == "duet" and target == "/models"):  # the user's models folder
                    check(os.path.exists(os.path.join(d, host)), f"service {name} mounts {host}, which does not exist")
            else:
                check(host in named_volumes, f"service {name} mounts volume {host}, which is not declared")
    duet = services["duet"]
    b = duet["build"]
    check(os.path.exists(os.path.join(d, b["context"], b.get("dockerfile", "Dockerfile"))),
          "duet's build context has no Dockerfile")
    check(f"{duet_port}:{duet_port}" in [str(p) for p in duet.get("ports", [])] or
          any(str(p).endswith(f":{duet_port}") for p in duet.get("ports", [])), f"duet's port {duet_port} is not published")
    check("/models" in mounts["duet"], "duet does not mount the models at /models")
    cmd = duet.get("command", [])
    if "--files-dir" in cmd:
        files_dir = cmd[cmd.index("--files-dir") + 1]
        check(files_dir in mounts["duet"], f"duet keeps batches in {files_dir}, which no volume holds (they would not "
                                           "outlive the container)")
    hc = " ".join(duet["healthcheck"]["test"])
    m = re.search(r"http://127\.0\.0\.1:(\d+)(/\S*)", hc)
    check(m is not None and int(m.group(1)) == duet_port, f"duet's healthcheck {hc} does not ask duet's port")
    if m:
        routes.add(m.group(2))
    grace = duet.get("stop_grace_period", "10s")
    cmd = duet.get("command", [])
    timeout = int(cmd[cmd.index("--shutdown-timeout") + 1]) if "--shutdown-timeout" in cmd else 30
    check(int(str(grace).rstrip("s")) > timeout, f"stop_grace_period {grace} is not longer than --shutdown-timeout {timeout}")
    # Prometheus: its --config.file is in a mounted folder that holds prometheus.yml and the rules,
    # and it scrapes the duet service on duet's port.
    prom = services["prometheus"]
    cfg_file = next(a.split("=", 1)[1] for a in prom["command"] if a.startswith("--config.file="))
    host_dir = mounts["prometheus"].get(os.path.dirname(cfg_file))
    check(host_dir is not None, f"prometheus reads {cfg_file}, which no mount provides")
    if host_dir:
        pcfg = yaml.safe_load(open(os.path.join(d, host_dir, os.path.basename(cfg_file))))
        for rf in pcfg.get("rule_files", []):
            check(os.path.exists(os.path.join(d, host_dir, rf)), f"prometheus.yml's rule file {rf} is not in {host_dir}")
        targets = [t for sc in pcfg["scrape_configs"] for st in sc["static_configs"] for t in st["targets"]]
        check(f"duet:{duet_port}" in targets, f"prometheus scrapes {targets}, not duet:{duet_port}")
    # Grafana: the provisioning folder, a dashboards provider whose path is where the dashboards
    # are mounted, and a datasource that is the prometheus service.
    gm = mounts["grafana"]
    check(gm.get("/etc/grafana/provisioning") is not None, "grafana does not mount the provisioning folder")
    prov = os.path.join(d, gm.get("/etc/grafana/provisioning", ""))
    for f in os.listdir(os.path.join(prov, "dashboards")):
        for p in yaml.safe_load(open(os.path.join(prov, "dashboards", f)))["providers"]:
            path = p["options"]["path"]
            check(path in gm, f"grafana's dashboards provider reads {path}, which no mount provides")
            if path in gm:
                check(any(x.endswith(".json") for x in os.listdir(os.path.join(d, gm[path]))),
                      f"{gm[path]} holds no dashboard")
    for f in os.listdir(os.path.join(prov, "datasources")):
        for ds in yaml.safe_load(open(os.path.join(prov, "datasources", f)))["datasources"]:
            check(ds["url"] == "http://prometheus:9090", f"the datasource points at {ds['url']}, not the prometheus service")
    home = services["grafana"].get("environment", {}).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        folder = gm.get(os.path.dirname(home))
        check(folder is not None and os.path.exists(os.path.join(d, folder, os.path.basename(home))),
              f"grafana's home dashboard {home} is not mounted")


# --- the dashboard's own structure ---------------------------------------------------------------
def check_dashboard(src: str) -> None:
    import json
    dash = json.load(open(os.path.join(src, "deploy", "grafana", "dashboards", "duet.json")))
    ids = [p["id"] for p in dash["panels"]]
    check(len(ids) == len(set(ids)), "the dashboard's panel ids repeat")
    variables = {v["name"] for v in dash["templating"]["list"]}
    for p in dash["panels"]:
        g = p["gridPos"]
        check(g["x"] + g["w"] <= 24, f"panel '{p['title']}' is wider than the grid")
        if p["type"] != "row":
            check(p.get("targets"), f"panel '{p['title']}' has no query")
            check(p["datasource"]["uid"] == "${datasource}", f"panel '{p['title']}' does not use $datasource")
            for t in p.get("targets", []):
                for var in re.findall(r"\$(\w+)", t["expr"]):
                    check(var.startswith("__") or var in variables, f"panel '{p['title']}' uses ${var}, not defined")


# --- systemd -------------------------------------------------------------------------------------
def check_systemd(src: str, duet: str) -> None:
    d = os.path.join(src, "deploy", "systemd")
    unit: dict[str, str] = {}
    for line in open(os.path.join(d, "duet.service")):
        line = line.strip()
        if line and not line.startswith(("#", "[")):
            k, _, v = line.partition("=")
            unit[k] = v
    for key, want in (("Restart", "on-failure"), ("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                      ("ProtectHome", "yes"), ("PrivateTmp", "yes"), ("KillSignal", "SIGTERM")):
        check(unit.get(key) == want, f"duet.service: {key}={unit.get(key)}, expected {want}")
    exec_start = shlex.split(unit["ExecStart"])
    check(exec_start[1:3] == ["serve", "--config"], f"duet.service runs {exec_start}")
    cfg_path = exec_start[3]
    check(cfg_path == "/etc/duet/duet.yaml", f"duet.service reads {cfg_path}")
    cfg = config_of(open(os.path.join(d, "duet.yaml")).read(), "systemd/duet.yaml", duet)
    timeout = cfg.get("shutdown_timeout", 30)
    stop = int(unit.get("TimeoutStopSec", "90").rstrip("s"))
    check(timeout < stop <= timeout + 10, f"TimeoutStopSec={stop} does not match shutdown_timeout {timeout}")
    log_file = cfg.get("log_file", "")
    check(not log_file or log_file.startswith("/var/log/" + unit.get("LogsDirectory", "-") + "/"),
          f"duet.yaml logs to {log_file}, outside the unit's LogsDirectory")
    check(str(cfg.get("model", "")).startswith("/var/lib/" + unit.get("StateDirectory", "-") + "/"),
          "the model is not under the unit's StateDirectory")
    check(unit.get("ExecReload") == "/bin/kill -HUP $MAINPID",
          f"duet.service: ExecReload={unit.get('ExecReload')}, expected SIGHUP (duet opens its log file again)")
    rotate = open(os.path.join(d, "duet.logrotate")).read()
    globs = re.findall(r"^(/\S+)\s*\{", rotate, re.M)
    check(any(fnmatch.fnmatch(log_file, g) for g in globs) if log_file else True,
          f"duet.logrotate rotates {globs}, not duet.yaml's log_file {log_file}")
    check("systemctl reload duet.service" in rotate, "duet.logrotate does not reload duet.service after rotating")


def main() -> int:
    src, duet, routes_out = sys.argv[1], sys.argv[2], sys.argv[3]
    check_k8s(src, duet)
    port, _ = check_dockerfile(src, duet)
    check_compose(src, port)
    check_dashboard(src)
    check_systemd(src, duet)
    with open(routes_out, "w") as f:
        f.write("\n".join(sorted(routes)) + "\n")
    for p in problems:
        print("FAIL:", p)
    print(f"deploy/ manifests: routes used {sorted(routes)}; {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
