"""``cnode checkpoint verify|ls|export|import|gc``: checkpoints in the node's block store.

The store is ``load_config(home).blocks_dir(home)``. Formats: specs/manifest.md.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from cnode.node._config import default_home, load_config
from cnode.node._exceptions import UsageError
from cnode.storage import (
    CID,
    BlockStore,
    InvalidCIDError,
    VerifyReport,
    export_car,
    export_hf,
    import_car,
    import_hf,
    list_checkpoints,
    read_manifest,
    recorded_unixfs_root,
    verify_car,
    verify_checkpoint,
)

from . import _replay

# (set_total, advance) callbacks of a progress bar
_Hooks = tuple[Callable[[int], None], Callable[[int], None]]


def _store(args: argparse.Namespace, *, create: bool = True) -> BlockStore:
    """The node's block store; read-only commands pass create=False so they create nothing."""
    home = Path(args.home).expanduser()
    return BlockStore(load_config(home).blocks_dir(home), create=create)


def _cid(text: str) -> CID:
    try:
        return CID.parse(text)
    except InvalidCIDError as exc:
        raise UsageError(f"{text!r} is not a manifest CID: {exc}") from exc


@contextmanager
def _progress(label: str, quiet: bool) -> Iterator[_Hooks]:
    """A byte progress bar on stderr; yields (set_total, advance)."""
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=quiet or not console.is_terminal,
    ) as progress:
        task = progress.add_task(label, total=None)

        def set_total(total: int) -> None:
            progress.update(task, total=total)

        def advance(n: int) -> None:
            progress.advance(task, n)

        yield set_total, advance


def _print_report(report: VerifyReport) -> None:
    console = Console()
    m = report.manifest
    if m is not None:
        console.print(
            f"manifest {report.manifest_cid}: {m.kind} of run {m.run_id!r}, epoch {m.epoch}, "
            f"round {m.round}, step {m.step}; {report.layers} layers"
        )
        view = recorded_unixfs_root(m.extra)
        if view is not None:
            console.print(f"UnixFS view (ipfs get, /ipfs/CID on a gateway): {view}")
    console.print(f"checked {report.blocks_checked} blocks, {report.bytes_checked} bytes")
    for note in report.notes:
        console.print(f"note: {note}")
    if report.ok:
        console.print("[green]OK[/green]: every block present and matching its CID")
        return
    console.print(f"{len(report.faults)} fault(s):", highlight=False)
    for fault in report.faults:  # one line each; the message names the CID and the layer
        console.print(f"  {fault.kind}: {fault.message}", highlight=False, soft_wrap=True)
    console.print("[red]FAILED[/red]")


def _verify(args: argparse.Namespace) -> int:
    target: str = args.target
    if args.peer and not args.replay:
        raise UsageError("--peer is for --replay (to fetch what it needs)")
    if args.replay:
        return _verify_and_replay(args)
    with _progress("verifying", args.json) as (set_total, advance):
        if target.endswith(".car") or Path(target).is_file():
            path = Path(target)
            if not path.is_file():
                raise UsageError(f"no such CAR file: {path}")
            report = verify_car(path, on_total=set_total, on_progress=advance)
        else:
            store = _store(args, create=False)
            report = verify_checkpoint(store, _cid(target), on_total=set_total, on_progress=advance)
            _check_signatures(store, report)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        _print_report(report)
    return 0 if report.ok else 1


def _check_signatures(store: BlockStore, report: VerifyReport) -> None:
    """Add to ``report`` what the signed update headers of the aggregation record say."""
    if report.manifest is None or report.manifest.aggregation is None:
        return
    from cnode.node.train import check_signed_updates  # torch: only where there is a record

    found = check_signed_updates(store, report.manifest)
    for cid, reason in found.faults:
        report.fault("update-signature", f"signed update header {cid}: {reason}", cid)
    if found.valid:
        report.notes.append(f"{found.valid} signed update headers: signature, run and round OK")


def _verify_and_replay(args: argparse.Namespace) -> int:
    """``verify --replay``: fetch (with --peer), verify every block, then recompute."""
    if args.target.endswith(".car") or Path(args.target).is_file():
        raise UsageError(
            "--replay needs a manifest CID in the store: cnode checkpoint import the CAR first"
        )
    manifest = _cid(args.target)
    fetched = (0, 0)
    if args.peer:
        store = _store(args)
        fetched = _replay.fetch_inputs(args, store, manifest)
    else:
        store = _store(args, create=False)
    with _progress("verifying", args.json) as (set_total, advance):
        report = verify_checkpoint(store, manifest, on_total=set_total, on_progress=advance)
    _check_signatures(store, report)
    outcome = (
        _replay.replay(store, manifest, fetched=fetched)
        if report.ok
        else _replay.ReplayOutcome(False, "replay not attempted: the checkpoint has faults")
    )
    if args.json:
        print(json.dumps({**report.to_dict(), "replay": outcome.to_dict()}, indent=2))
    else:
        if args.peer:
            print(f"fetched {fetched[0]} blocks ({fetched[1] / 1e6:.1f} MB) from the peers")
        _print_report(report)
        Console().print(outcome.message, highlight=False, soft_wrap=True)
    return 0 if report.ok and outcome.ok else 1


def _ls(args: argparse.Namespace) -> int:
    infos = list_checkpoints(_store(args, create=False))
    if args.json:
        rows: list[dict[str, Any]] = [
            {**info.__dict__, "cid": str(info.cid), "pins": list(info.pins)} for info in infos
        ]
        print(json.dumps(rows, indent=2))
        return 0
    if not infos:
        print("no checkpoints in the store")
        return 0
    # one line each: a CID must stay whole and copyable whatever the terminal width
    for i in infos:
        state = "complete" if not i.missing else f"{i.missing} blocks missing"
        if i.pins:
            state += ", pinned"
        print(
            f"{i.cid}  {i.kind:<10}  run={i.run_id} epoch={i.epoch} round={i.round} "
            f"step={i.step}  {i.layers} layers  {i.total_bytes / 1e6:.1f} MB  {state}"
        )
    return 0


def _export(args: argparse.Namespace) -> int:
    store = _store(args)
    cid = _cid(args.manifest)
    total = read_manifest(store, cid).total_bytes
    with _progress("exporting", False) as (set_total, advance):
        set_total(total)
        if args.car:
            blocks = export_car(store, cid, Path(args.car), on_progress=advance)
            done = f"wrote {blocks} blocks to {args.car}"
        else:
            export_hf(store, cid, Path(args.hf), on_progress=advance)
            done = f"wrote Hugging Face folder {args.hf}"
    print(done)
    return 0


def _import(args: argparse.Namespace) -> int:
    store = _store(args)
    if bool(args.file) == bool(args.hf):
        raise UsageError("give either FILE.car or --hf DIR")
    with _progress("importing", False) as (_, advance):
        if args.file:
            cid = import_car(store, Path(args.file), on_progress=advance)
        else:
            cid = import_hf(
                store,
                Path(args.hf),
                run_id=args.run_id,
                allow_nonfinite=args.allow_nonfinite,
                on_progress=advance,
            )
    print(cid)
    return 0


def _gc(args: argparse.Namespace) -> int:
    removed = _store(args).gc()
    print(f"removed {removed} unpinned blocks")
    return 0


def register(subparsers: Any) -> None:
    """Add the checkpoint actions to ``cnode checkpoint``'s subparsers."""

    def add(name: str, help_text: str, handler: Callable[[argparse.Namespace], int]) -> Any:
        p = subparsers.add_parser(name, help=help_text, description=help_text)
        p.add_argument(
            "--home", default=str(default_home()), help="node home folder (default: %(default)s)"
        )
        p.set_defaults(handler=handler)
        return p

    p = add("verify", "check a checkpoint: manifest, every block, shapes, updates", _verify)
    p.add_argument("target", metavar="MANIFEST_CID|FILE.car")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _replay.add_arguments(p)
    p = add("ls", "list the checkpoints (manifests) in the block store", _ls)
    p.add_argument("--json", action="store_true", help="print JSON")
    p = add("export", "write a checkpoint as a CAR v1 file or a Hugging Face folder", _export)
    p.add_argument("manifest", metavar="MANIFEST_CID")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--car", metavar="OUT.car", help="CAR v1 file to write (root = manifest)")
    where.add_argument("--hf", metavar="DIR", help="Hugging Face model folder to create")
    p = add("import", "import a CAR v1 file or a Hugging Face folder (verified, atomic)", _import)
    p.add_argument("file", nargs="?", metavar="FILE.car")
    p.add_argument("--hf", metavar="DIR", help="Hugging Face model folder (safetensors)")
    p.add_argument("--run-id", default="hf-import", help="run id for an --hf import")
    p.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="with --hf: import tensors holding NaN/Inf (with a warning) instead of refusing",
    )
    add("gc", "remove blocks not reachable from a pinned checkpoint", _gc)
