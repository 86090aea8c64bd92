"""``llmcomm explore``: serve the teaching explorer as a standalone page (Voilà, no code shown) on 127.0.0.1."""

from __future__ import annotations

import argparse

HELP = "serve the interactive explorer (layout, matrix, bytes, calls, time) as a page on 127.0.0.1"
DESCRIPTION = ("Serve llmcomm.explore as a standalone web page with Voilà on 127.0.0.1 and print its URL; stop "
               "with Ctrl-C. Change the model, the cluster and tp/pp/dp/cp/ep/vpp/SP/batch; an impossible "
               "choice shows the rule it breaks. In JupyterLab: from llmcomm.explore import explore; explore().")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("explore", help=HELP, description=DESCRIPTION)
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: 0, a free one)")
    p.add_argument("--model", default=None, help="starting model: catalogue name or YAML path (default: gpt3-6.7b)")
    p.add_argument("--cluster", default=None, help="starting cluster (default: a100-80g-hdr200)")
    p.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for the server to start")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    from .serve import start_page
    from .view import Choice

    kw = {k: v for k, v in (("model", args.model), ("cluster", args.cluster)) if v is not None}
    choice = Choice(**kw)
    if kw:
        from .view import compute

        compute(choice)  # a bad starting model or cluster fails here, with the rule, not in the page
    import signal

    def _terminate(_sig: int, _frame: object) -> None:  # SIGTERM ends the server and its kernels too
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    page = start_page(choice, port=args.port, timeout=args.timeout)
    print(f"llmcomm explore: serving on {page.url}  (Ctrl-C to stop)", flush=True)
    try:
        while page.process.poll() is None:
            time.sleep(0.5)
        print(f"llmcomm explore: the server exited with status {page.process.returncode}", flush=True)
        return 1
    finally:
        page.stop()
