"""On a GPU node (stock python3, nothing installed): the process listening on the server's TCP port, its argv
and environment from /proc/PID/{cmdline,environ}, as one JSON object on stdout. No listener here, or one of
another user's processes (`ss` shows no pid then), is stated with pid null, never guessed. Values of
secret-looking variables are dropped here already; the controller redacts again before saving
(preflight/stage.py, core/redact.py). Usage: python3 -c "$(cat live_process.py)" PORT"""

import json
import re
import subprocess
import sys

SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|(^|_)KEY$|API_?KEY|AUTH", re.IGNORECASE)


def listening(ss, port):
    """The LISTEN lines of `ss -ltnp` output (header or not) on `port`, and their pids (none for another
    user's process)."""
    lines = [line.strip() for line in ss.splitlines()
             if len(line.split()) > 3 and line.split()[0] == "LISTEN" and line.split()[3].rsplit(":", 1)[-1] == str(port)]
    return lines, sorted({int(p) for line in lines for p in re.findall(r"pid=(\d+)", line)})


def from_ss(stdout, returncode, stderr, port):
    """(answer, listener lines) as far as `ss` tells it; with a pid, main reads its /proc and completes it."""
    lines, pids = listening(stdout, port)
    if returncode != 0 and not lines:   # no answer is not "nobody listens"
        return {"port": port, "pid": None, "reason": f"ss -ltnpH failed (rc {returncode}): {stderr.strip()[:300]}"}, []
    if not lines:
        return {"port": port, "pid": None, "reason": f"no process listens on port {port} on this node"}, []
    if not pids:
        return {"port": port, "pid": None, "listeners": lines,
                "reason": f"a process listens on port {port} but ss shows no pid (another user's): read it as "
                          "that user or with become"}, lines
    return {"port": port, "pid": pids[0], "listeners": lines}, lines


def main(port):
    try:
        ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"port": port, "pid": None, "reason": f"ss -ltnpH failed: {exc}"}
    told, lines = from_ss(ss.stdout, ss.returncode, ss.stderr, port)
    if told["pid"] is None:
        return told
    pid = told["pid"]
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError as exc:
        return {"port": port, "pid": None, "listeners": lines, "reason": f"cannot read /proc/{pid}/cmdline: {exc}"}
    env, notes = {}, []
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            for part in handle.read().split(b"\0"):
                name, sep, value = part.decode(errors="replace").partition("=")
                if sep and name:
                    env[name] = "<redacted>" if SECRET.search(name) else value
    except OSError as exc:
        notes.append(f"environment not readable: {exc}")
    return {"port": port, "pid": pid, "argv": argv, "env": env, "listeners": lines, "notes": notes,
            "source": f"ss -ltnpH; /proc/{pid}/cmdline, /proc/{pid}/environ"}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1])), indent=1, sort_keys=True))
