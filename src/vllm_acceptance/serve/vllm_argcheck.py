"""vLLM's own argument checks of `vllm serve` command lines, run BY the Python whose vLLM judges them.

Standalone (the standard library and the vLLM installed beside it, nothing of vllm_acceptance): the controller
runs it with a configured vLLM Python (serve/vllm_check.py; the lab venv by default), preflight runs it inside
the image on the head node (`docker run --rm --gpus all --entrypoint python3 IMAGE -c <this file> JSON`, as the
in-image probe and all-reduce run). One process judges every node of every deployment given, so vLLM is
imported once (docs/plan.md "vLLM's own checks").

    python vllm_argcheck.py '{"target": {...}, "deployments": {"KEY": [{"host", "role", "entry", "serve_args",
                                                                          "env"}, ...]}}'
    (or the JSON on standard input); the answer is one line on standard output: MARK JSON.

Per node, in the order `vllm serve` runs them (vllm/entrypoints/cli/main.py main, cli/serve.py):
1. the parser: `make_arg_parser` on a `FlexibleArgumentParser` under a `serve` subcommand, as main() builds it
   (`ServeSubcommand.subparser_init`); a process started as `python -m vllm.entrypoints.openai.api_server`
   (entry "api_server") gets that module's own parser (launchers/api_server/entry.py main);
2. `validate_parsed_serve_args` (launchers/cli_args.py): chat template, tool parser beside auto tool choice,
   gRPC port, log options, the multi-port external LB;
3. `ServeSubcommand.cmd` itself (cli/serve.py): --headless with --api-server-count, the data-parallel load
   balancing modes ("Cannot use more than one data parallel load balancing mode"), the API server count, and
   which launcher it chooses; the launchers (run_headless, run_multi_api_server, run_dp_supervisor, run_server)
   are replaced by recorders for this call, so nothing is started;
4. the chosen launcher's own checks, up to where it would bind a socket or start a process: `run_headless`
   (api_server_count, `AsyncEngineArgs.from_cli_args`, "data_parallel_hybrid_lb is not applicable in headless
   mode"), `run_multi_api_server` (`setup_server`'s `validate_api_server_args`: the tool and reasoning parsers
   registered in this vLLM, `from_cli_args`, VLLM_ALLOW_RUNTIME_LORA_UPDATING); one API server: the same pieces
   of `run_server` / `build_async_engine_client` in their order. `EngineArgs.__post_init__` runs (the
   --compilation-config, --attention-config, --kernel-config, ... objects and the quantization config are built
   and validated).

Not run, and why (stated in every answer as `not_run`): `EngineArgs.create_engine_config`. It builds the model's
config from its files (`create_model_config`: the HF config, trust_remote_code) and asks the platform for its
device and memory (the parallel, cache and scheduler configs, the default batch sizes); the launch runs it and
the serve stage judges what it resolved (compat.startup_log, compat.actual_config.*). The launchers above call it
between their checks: here it returns a stand-in whose first use ends the node's check (accepted up to there).

Where the judging vLLM is not the build that will run (`target.same_build` false: the controller's lab venv, a CPU
build, judging a CUDA image's command), what only that build can judge is left out and named in `not_judged`:
- arguments whose accepted values depend on the platform (`PLATFORM_CHOICES`, vLLM's source cited);
- VLLM_USE_RUST_FRONTEND=1 without a vllm-rs binary in this installation (vllm/envs.py
  _resolve_rust_cli_path): judged as the image would with its binary;
- files on the node (--config, a path-like --chat-template, --tool-parser-plugin, --reasoning-parser-plugin).
HF_HUB_OFFLINE is cleared before vLLM is imported: the model's files are never read by these checks.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import time
import traceback
from typing import Any

MARK = "@@vllm-argcheck@@"
# Arguments whose choices vLLM builds from the platform it runs on; a build for another platform cannot judge
# their value (the CPU wheel refuses `--mm-processor-device cuda`, a CUDA build accepts it).
PLATFORM_CHOICES = {
    "--mm-processor-device": "its choices add the platform's device type (vllm/engine/arg_utils.py "
                             "EngineArgs.add_cli_args: [current_platform.device_type])",
}
# Node files the check cannot read where it does not run on the node.
NODE_FILES = ("--config", "--tool-parser-plugin", "--reasoning-parser-plugin")


class Dispatched(Exception):  # noqa: N818 - a signal, not an error
    """ServeSubcommand.cmd chose a launcher (recorded, never run)."""

    def __init__(self, mode: str) -> None:
        super().__init__(mode)
        self.mode = mode


class Reached(Exception):  # noqa: N818 - a signal, not an error
    """The launcher got to the engine config, a socket or a process: every check before it passed."""


class NotBuilt:
    """What create_engine_config returns here: any use of it ends the node's check."""

    def __getattr__(self, name: str) -> Any:
        raise Reached(f"the engine config ({name})")


def _flag_value(argv: list[str], flag: str) -> tuple[int, str | None] | None:
    for index, arg in enumerate(argv):
        if arg == flag:
            return index, argv[index + 1] if index + 1 < len(argv) else None
        if arg.startswith(flag + "="):
            return index, arg.split("=", 1)[1]
    return None


def _drop(argv: list[str], flag: str) -> list[str]:
    found = _flag_value(argv, flag)
    if found is None:
        return argv
    index, _ = found
    width = 1 if "=" in argv[index] else 2
    return argv[:index] + argv[index + width:]


class Judge:
    def __init__(self, target: dict[str, Any]) -> None:
        import vllm
        import vllm.entrypoints.cli.serve as serve
        from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
        from vllm.entrypoints.launchers import cli_args, launcher
        from vllm.platforms import current_platform
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        self.vllm, self.serve, self.cli_args, self.launcher = vllm, serve, cli_args, launcher
        self.AsyncEngineArgs, self.EngineArgs = AsyncEngineArgs, EngineArgs
        self.FlexibleArgumentParser = FlexibleArgumentParser
        self.device = str(current_platform.device_type or "")
        self.target = target
        self.aim(target)
        # `vllm serve`'s parser, as vllm/entrypoints/cli/main.py builds it
        self.parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
        subparsers = self.parser.add_subparsers(required=False, dest="subparser")
        self.command = serve.ServeSubcommand()
        self.command.subparser_init(subparsers).set_defaults(dispatch_function=self.command.cmd)
        # `python -m vllm.entrypoints.openai.api_server`'s parser (launchers/api_server/entry.py main)
        self.module_parser = cli_args.make_arg_parser(FlexibleArgumentParser(
            prog="python -m vllm.entrypoints.openai.api_server",
            description="vLLM OpenAI-Compatible RESTful API server."))

    def aim(self, target: dict[str, Any]) -> None:
        """What will run the commands: its platform (`device`), whether this is that very vLLM installation
        (`same_build`) and whether the check runs on the node (`on_node`: its files are here)."""
        self.same_build = bool(target.get("same_build"))
        self.on_node = bool(target.get("on_node"))
        self.target_device = str(target.get("device") or self.device)

    # --- one node ---------------------------------------------------------------------------------------

    def node(self, spec: dict[str, Any]) -> dict[str, Any]:
        """One node's command; a node's own `target` (the tests' batches) outranks the run's."""
        self.aim({**self.target, **(spec.get("target") or {})})
        try:
            return self._node(spec)
        finally:
            self.aim(self.target)

    def _node(self, spec: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"host": spec.get("host"), "role": spec.get("role"), "accepted": None,
                               "stage": None, "message": None, "where": None, "mode": None,
                               "not_judged": [], "warnings": []}
        argv = [str(a) for a in spec.get("serve_args") or []]
        entry = str(spec.get("entry") or "serve")
        env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
        saved = dict(os.environ)
        handler = _Collect()
        logging.getLogger("vllm").addHandler(handler)
        try:
            os.environ.update(env)
            os.environ["HF_HUB_OFFLINE"] = "0"
            if env.get("HF_HUB_OFFLINE", "0") not in ("0", ""):
                out["not_judged"].append("HF_HUB_OFFLINE of the launch: the model's files are not read here")
            argv = self._off_target(argv, env, out)
            if out["accepted"] is None and out["stage"] == "not_judged":
                return out
            self._judge(argv, entry, out)
        finally:
            os.environ.clear()
            os.environ.update(saved)
            logging.getLogger("vllm").removeHandler(handler)
            out["warnings"] = handler.lines[:20]
        return out

    def _off_target(self, argv: list[str], env: dict[str, str], out: dict[str, Any]) -> list[str]:
        """Leave out what only the build that will run (or the node) can judge, naming it."""
        if not self.on_node:
            if _flag_value(argv, "--config") is not None:
                out["stage"] = "not_judged"
                out["not_judged"].append("--config: the arguments are in a file on the node; the whole command "
                                         "is judged only where that file is (preflight, inside the image)")
                return argv
            for flag in NODE_FILES[1:]:
                if _flag_value(argv, flag) is not None:
                    out["not_judged"].append(f"{flag}: a file on the node, imported there")
            template = _flag_value(argv, "--chat-template")
            if template is not None and template[1] is not None and not any(c in template[1] for c in "{}\n"):
                out["not_judged"].append(f"--chat-template {template[1]}: a path on the node")
        if self.same_build:
            return argv
        if self.target_device != self.device:
            for flag, why in PLATFORM_CHOICES.items():
                found = _flag_value(argv, flag)
                if found is not None:
                    argv = _drop(argv, flag)
                    out["not_judged"].append(f"{flag} {found[1]}: {why}; this vLLM runs on "
                                             f"{self.device or 'no platform'}, the deployment on "
                                             f"{self.target_device}")
        if env.get("VLLM_USE_RUST_FRONTEND", "0") not in ("0", ""):
            try:
                import vllm.envs as envs

                envs.VLLM_RUST_FRONTEND_PATH  # noqa: B018 - raises without the vllm-rs binary
            except FileNotFoundError:
                os.environ["VLLM_RUST_FRONTEND_PATH"] = "vllm-rs (absent from the judging vLLM)"
                out["not_judged"].append("VLLM_USE_RUST_FRONTEND=1: this vLLM installation has no vllm-rs binary "
                                         "(vllm/envs.py _resolve_rust_cli_path); judged as a build that has it")
        return argv

    def _refuse(self, out: dict[str, Any], stage: str, exc: BaseException) -> None:
        out["accepted"], out["stage"] = False, stage
        out["message"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f"{os.sep}vllm{os.sep}" in f.filename]
        if frames:
            last = frames[-1]
            path = last.filename.split(f"{os.sep}vllm{os.sep}", 1)[1]
            out["where"] = f"vllm/{path}:{last.lineno} {last.name}"

    def _judge(self, argv: list[str], entry: str, out: dict[str, Any]) -> None:
        stage = "parser"
        try:
            args = self._parse(argv, entry, out)
            if args is None:
                return
            stage = "validate_parsed_serve_args"
            if not self.on_node and _flag_value(argv, "--chat-template") is not None and \
                    any(n.startswith("--chat-template") for n in out["not_judged"]):
                template, args.chat_template = args.chat_template, None
                self.cli_args.validate_parsed_serve_args(args)
                args.chat_template = template
            else:
                self.cli_args.validate_parsed_serve_args(args)
            if entry == "api_server":
                stage, out["mode"] = "run_server", "api_server"
                self._single_server(args)
            else:
                stage = "ServeSubcommand.cmd"
                mode = self._dispatch(args)
                out["mode"] = mode
                stage = {"headless": "run_headless", "multi_api_server": "run_multi_api_server"}.get(mode, mode)
                self._launcher(mode, args)
        except Reached:
            pass
        except SystemExit as exc:          # argparse's exit outside parse (a --help, a parser.error)
            self._refuse(out, stage, RuntimeError(f"exit {exc.code}"))
            return
        except Exception as exc:  # noqa: BLE001 - vLLM's refusal, whatever its type, is the answer
            self._refuse(out, stage, exc)
            return
        out["accepted"], out["stage"] = True, "accepted"

    def _parse(self, argv: list[str], entry: str, out: dict[str, Any]) -> Any:
        err = io.StringIO()
        parser = self.module_parser if entry == "api_server" else self.parser
        words = argv if entry == "api_server" else ["serve", *argv]
        try:
            with contextlib.redirect_stderr(err):
                return parser.parse_args(words)
        except SystemExit:
            lines = [line for line in err.getvalue().splitlines() if line.strip()]
            message = next((line for line in reversed(lines) if ": error: " in line), lines[-1] if lines else "")
            out["accepted"], out["stage"], out["message"] = False, "parser", message.strip()
            out["where"] = "argparse (vllm/utils/argparse_utils.py FlexibleArgumentParser)"
            return None

    def _dispatch(self, args: Any) -> str:
        """ServeSubcommand.cmd with its launchers replaced by recorders: its own checks, and its choice."""
        serve = self.serve

        def record(mode: str) -> Any:
            def recorder(*_a: Any, **_k: Any) -> Any:
                raise Dispatched(mode)
            return recorder

        class Loop:
            run = staticmethod(record("api_server"))

        saved = {name: getattr(serve, name) for name in ("run_headless", "run_multi_api_server",
                                                          "run_dp_supervisor", "run_server", "uvloop")}
        serve.run_headless, serve.run_multi_api_server = record("headless"), record("multi_api_server")
        serve.run_dp_supervisor = record("dp_supervisor")
        serve.run_server = lambda *_a, **_k: None      # uvloop.run(run_server(args)): the loop records
        serve.uvloop = Loop
        try:
            self.command.cmd(args)
        except Dispatched as chosen:
            return chosen.mode
        finally:
            for name, value in saved.items():
                setattr(serve, name, value)
        raise RuntimeError("ServeSubcommand.cmd returned without choosing a launcher")

    def _launcher(self, mode: str, args: Any) -> None:
        serve = self.serve
        if mode == "headless":
            with self._no_engine():
                serve.run_headless(args)
        elif mode == "multi_api_server":
            with self._no_engine(), self._no_server():
                serve.run_multi_api_server(args)
        elif mode == "api_server":
            self._single_server(args)
        else:                          # dp_supervisor, grpc: their own checks ran in validate_parsed_serve_args
            engine_args = self.AsyncEngineArgs.from_cli_args(args)
            self.cli_args.propagate_flash_late_interaction(args, engine_args)

    def _single_server(self, args: Any) -> None:
        """run_server's pieces in its order: setup_server's validate_api_server_args, then
        build_async_engine_client's from_cli_args (launchers/api_server/entry.py)."""
        self._server_checks(args)
        engine_args = self.AsyncEngineArgs.from_cli_args(args)
        self.cli_args.propagate_flash_late_interaction(args, engine_args)

    def _server_checks(self, args: Any) -> None:
        """setup_server (launchers/launcher.py) without its socket: the plugins it imports, on the node only,
        and validate_api_server_args."""
        if self.on_node:
            manager = self.launcher.ToolParserManager
            if args.tool_parser_plugin and len(args.tool_parser_plugin) > 3:
                manager.import_tool_parser(args.tool_parser_plugin)
            if args.reasoning_parser_plugin and len(args.reasoning_parser_plugin) > 3:
                self.launcher.ReasoningParserManager.import_reasoning_parser(args.reasoning_parser_plugin)
        self.launcher.validate_api_server_args(args)

    @contextlib.contextmanager
    def _no_engine(self) -> Any:
        """create_engine_config returns NotBuilt; the engine and executor classes would start processes."""
        serve, engine = self.serve, self.EngineArgs

        def refuse_start(*_a: Any, **_k: Any) -> Any:
            raise Reached("a process start")

        class Quiet:
            SIGTERM, SIGINT = 15, 2
            signal = staticmethod(lambda *_a, **_k: None)

        saved = {name: getattr(serve, name) for name in ("CoreEngineProcManager", "MultiprocExecutor", "signal")}
        create = engine.__dict__["create_engine_config"]
        manager = serve.ReasoningParserManager
        plugin = manager.__dict__["import_reasoning_parser"]
        serve.CoreEngineProcManager = serve.MultiprocExecutor = refuse_start
        serve.signal = Quiet
        engine.create_engine_config = lambda *_a, **_k: NotBuilt()
        if not self.on_node:
            manager.import_reasoning_parser = staticmethod(lambda *_a, **_k: None)
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(serve, name, value)
            engine.create_engine_config = create
            manager.import_reasoning_parser = plugin

    @contextlib.contextmanager
    def _no_server(self) -> Any:
        """run_multi_api_server's socket, prometheus directory and gRPC listener; setup_server's checks run."""
        serve = self.serve

        def setup(args: Any, *, reuse_port: bool) -> tuple[str, None]:  # noqa: ARG001 - setup_server's signature
            self._server_checks(args)
            return "http://checked", None

        saved = {name: getattr(serve, name) for name in ("setup_server", "setup_multiprocess_prometheus",
                                                          "create_server_socket")}
        serve.setup_server = setup
        serve.setup_multiprocess_prometheus = lambda *_a, **_k: None
        serve.create_server_socket = lambda *_a, **_k: None
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(serve, name, value)


class _Collect(logging.Handler):
    """vLLM's warnings while a node is judged (deprecated flags, unknown VLLM_* variables, ...)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.lines.append(record.getMessage()[:400])


def main(argv: list[str]) -> int:
    raw = argv[1] if len(argv) > 1 and argv[1] != "-" else sys.stdin.read()
    payload = json.loads(raw)
    os.environ["HF_HUB_OFFLINE"] = "0"          # before huggingface_hub is imported: no model file is read
    started = time.monotonic()
    answer: dict[str, Any] = {"python": sys.executable, "deployments": {}}
    try:
        quiet = io.StringIO()
        with contextlib.redirect_stdout(quiet):
            judge = Judge(payload.get("target") or {})
            import vllm

            answer.update(vllm_version=str(getattr(vllm, "__version__", "unknown")), platform=judge.device,
                          import_s=round(time.monotonic() - started, 2))
            for key, nodes in (payload.get("deployments") or {}).items():
                answer["deployments"][key] = [judge.node(node) for node in nodes]
    except Exception as exc:  # noqa: BLE001 - the judge itself could not run: said, never a verdict
        answer["error"] = f"{type(exc).__name__}: {exc}"
    answer["wall_s"] = round(time.monotonic() - started, 2)
    answer["not_run"] = ("EngineArgs.create_engine_config: needs the model's config files and the target platform "
                         "(the launch runs it; the serve stage judges what it resolved)")
    sys.stdout.write(MARK + " " + json.dumps(answer) + "\n")
    sys.stdout.flush()
    return 0 if "error" not in answer else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv))
