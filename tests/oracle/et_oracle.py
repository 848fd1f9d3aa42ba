"""Check .pte files against the real ExecuTorch runtime; run by the oracle venv's python only.

  load PTE [--method NAME]          load_program (InternalConsistency), optionally load_method too
  run PTE INPUTS_NPZ OUTPUTS_NPZ    execute `forward` on arg0, arg1, ... and save out0, out1, ...
  (serve only) run_calls            execute one loaded program's methods in turn, {"calls": [method, ...]}: call
                                    k's inputs c{k}_arg0, ..., its outputs c{k}_out0, ... (each method loaded
                                    before the first call, as a device runner does; state carries over)
  export MODEL_PY OUT_PTE           export with ExecuTorch itself: MODEL_PY defines `model` and `example_inputs`,
                                    or is an ExportedProgram saved by torch.export.save (.pt2)
  kernels                           the operators the runtime has kernels for
  serve                             answer JSON requests {"command": "load"|"run"|"export"|"export_ethosu", ...},
                                    one a line, from standard input: one process for many programs
                                    (export_ethosu: an Ethos-U .pte by ExecuTorch's Arm backend, et_export.py)

The result is printed as one JSON line starting with MARKER (imports print unrelated noise);
the exit status is 1 when the runtime refused the file.
"""

import argparse
import json
import runpy
import sys

MARKER = "ET_ORACLE_RESULT "


def load(args):
    from executorch.runtime import Runtime, Verification

    program = Runtime.get().load_program(args.pte, verification=Verification.InternalConsistency)
    if args.method:
        program.load_method(args.method)
    return {"methods": sorted(program.method_names)}


def run(args):
    import executorch.kernels.quantized  # noqa: F401  (registers quantized_decomposed kernels)
    import numpy as np
    import torch
    from executorch.runtime import Runtime, Verification

    arrays = np.load(args.inputs)
    inputs = [torch.from_numpy(arrays[f"arg{i}"]) for i in range(len(arrays.files))]
    for i in getattr(args, "channels_last", None) or []:  # the runtime takes the bytes in the program's dim order
        inputs[i] = inputs[i].to(memory_format=torch.channels_last)
    data = {"data_path": args.data} if getattr(args, "data", None) else {}
    program = Runtime.get().load_program(args.pte, verification=Verification.InternalConsistency, **data)
    outputs = program.load_method("forward").execute(inputs)
    np.savez(args.outputs, **{f"out{i}": np.asarray(o) for i, o in enumerate(outputs)})
    return {"outputs": len(outputs)}


def run_calls(args):
    import executorch.kernels.quantized  # noqa: F401  (registers quantized_decomposed kernels)
    import numpy as np
    import torch
    from executorch.runtime import Runtime, Verification

    arrays = np.load(args.inputs)
    program = Runtime.get().load_program(args.pte, verification=Verification.InternalConsistency)
    methods = {m: program.load_method(m) for m in args.calls}  # all loaded first: loading writes initial state
    saved = {}
    for k, method in enumerate(args.calls):
        count = sum(1 for name in arrays.files if name.startswith(f"c{k}_arg"))
        inputs = [torch.from_numpy(arrays[f"c{k}_arg{i}"]) for i in range(count)]
        outputs = methods[method].execute(inputs)
        saved.update({f"c{k}_out{i}": np.asarray(o) for i, o in enumerate(outputs)})
    np.savez(args.outputs, **saved)
    return {"calls": len(args.calls)}


def kernels(_args):
    import executorch.kernels.quantized  # noqa: F401  (registers quantized_decomposed kernels)
    from executorch.extension.pybindings import portable_lib

    import torch
    from executorch.exir.passes import dim_order_ops_registry  # noqa: F401  (registers dim_order_ops schemas)

    names = sorted(set(portable_lib._get_operator_names()))
    schemas = {}
    for name in names:
        namespace, _, rest = name.partition("::")
        op, _, overload = rest.partition(".")
        try:
            schemas[name] = str(getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")._schema)
        except (AttributeError, RuntimeError):
            pass  # registered in the runtime with no Python schema (e.g. executorch_prim)
    return {"kernels": names, "schemas": schemas}


def export(args):
    import torch
    from executorch.exir import to_edge

    if args.model_py.endswith(".pt2"):  # saved by torch.export.save beside the same torch version
        exported = torch.export.load(args.model_py)
    else:
        spec = runpy.run_path(args.model_py)
        exported = torch.export.export(spec["model"], tuple(spec["example_inputs"]))  # sources give eval-mode models
    with open(args.out_pte, "wb") as f:
        f.write(to_edge(exported).to_executorch().buffer)
    return {"written": args.out_pte}


def export_ethosu(args):
    """et_export.py's job (ExecuTorch's Ethos-U tutorial flow) for one model; its result."""
    from et_export import export_job  # beside this file (the script's folder is on sys.path)

    return export_job(vars(args))


def cortex_m_op(args):
    """et_cortex_m.py's operator job."""
    from et_cortex_m import cortex_m_op as job

    return job(vars(args))


def cortex_m_schemas(args):
    """et_cortex_m.py's schema job."""
    from et_cortex_m import cortex_m_schemas as job

    return job(vars(args))


def cortex_m_export(args):
    """et_cortex_m.py's export job (ExecuTorch's Cortex-M flow) for one model."""
    from et_cortex_m import cortex_m_export as job

    return job(vars(args))


def bundled(args):
    """A .bpte in ExecuTorch: its runtime runs each test case and verifies the expected outputs
    (verify_result_with_bundled_expected_output, at ``rtol``/``atol``); its devtools serializer reads the file back,
    each test case's values saved to ``out`` (NPZ: s{suite}_c{case}_in{i} and _out{i}), and the outputs the runtime
    computed (_got{i}) when it verified them. Without ``read_back`` the serializer is skipped and ``suites``
    ([[method, test cases]]) says what to verify."""
    import executorch.kernels.quantized  # noqa: F401  (registers quantized_decomposed kernels)
    import numpy as np
    from executorch.devtools.bundled_program.serialize import deserialize_from_flatbuffer_to_bundled_program
    from executorch.extension.pybindings import portable_lib

    data = open(args.bpte, "rb").read()
    arrays, suites, version = {}, [[m, n] for m, n in getattr(args, "suites", None) or []], None
    if getattr(args, "read_back", True):  # its flatc JSON round trip takes seconds per MB of program
        table = deserialize_from_flatbuffer_to_bundled_program(data)
        version, suites = table.version, [[t.method_name, len(t.test_cases)] for t in table.method_test_suites]
        for s, suite in enumerate(table.method_test_suites):
            for c, case in enumerate(suite.test_cases):
                for kind, values in (("in", case.inputs), ("out", case.expected_outputs)):
                    for i, v in enumerate(values):
                        t = v.val
                        if hasattr(t, "sizes"):  # stored in dim order: back to the logical order
                            stored = np.frombuffer(bytes(t.data), dtype=_NUMPY[int(t.scalar_type)])
                            order = list(t.dim_order) or list(range(len(t.sizes)))
                            stored = stored.reshape([t.sizes[d] for d in order])
                            arrays[f"s{s}_c{c}_{kind}{i}"] = stored.transpose(np.argsort(order))
    module = portable_lib._load_bundled_program_from_buffer(data)
    verified = []
    for s, (method, cases) in enumerate(suites):
        for c in range(cases):
            try:
                got = module.verify_result_with_bundled_expected_output(method, c, args.rtol, args.atol)
                verified.append([method, c, True, ""])
                arrays.update({f"s{s}_c{c}_got{i}": np.asarray(o) for i, o in enumerate(got)})
            except Exception as e:  # noqa: BLE001  (a mismatch is an answer)
                verified.append([method, c, False, f"{type(e).__name__}: {e}"])
    np.savez(args.out, **arrays)
    return {"version": version, "suites": suites, "verified": verified}


def bundle(args):
    """A .bpte written by ExecuTorch's own serializer: the program ``pte`` with one test case of ``forward``,
    inputs arg0, ... of the NPZ ``inputs`` and expected outputs out0, ... of ``expected``."""
    import numpy as np
    import torch
    from executorch.devtools import BundledProgram
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    def tensors(path, prefix):
        arrays = np.load(path)
        return [torch.from_numpy(arrays[f"{prefix}{i}"]) for i in range(len(arrays.files))]

    case = MethodTestCase(inputs=tensors(args.inputs, "arg"), expected_outputs=tensors(args.expected, "out"))
    bundled = BundledProgram(None, [MethodTestSuite("forward", [case])], pte_file_path=args.pte)
    with open(args.out, "wb") as f:
        f.write(serialize_from_bundled_program_to_flatbuffer(bundled))
    return {"written": args.out}


def etdump(args):
    """ExecuTorch's Inspector on the ETDump ``etdump`` (with ``debug_buffer``, its tensors too): each block's
    [name, [[event name, instruction id, runs timed, debug values]]]. With ``pte`` and ``inputs`` (NPZ arg0, ...),
    ExecuTorch's runtime first runs the program with ETDump enabled and writes its ETDump to ``etdump``."""
    import executorch.kernels.quantized  # noqa: F401  (registers quantized_decomposed kernels)
    import numpy as np
    import torch
    from executorch.devtools import Inspector
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    if getattr(args, "pte", None):
        arrays = np.load(args.inputs)
        module = _load_for_executorch(args.pte, enable_etdump=True)
        module.forward([torch.from_numpy(arrays[f"arg{i}"]) for i in range(len(arrays.files))])
        module.write_etdump_result_to_file(args.etdump)
    inspector = Inspector(etdump_path=args.etdump, debug_buffer_path=getattr(args, "debug_buffer", None))
    return {"blocks": [[b.name, [[e.name, e._instruction_id, len(e.perf_data.raw) if e.perf_data else 0,
                                  len(e.debug_data or [])] for e in b.events]] for b in inspector.event_blocks]}


_NUMPY = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64",
          11: "bool"}


def serve(_args):
    """One result line per request line; the runtime's own log of a refused request comes with its error."""
    import os
    import tempfile
    import types

    commands = {"load": load, "run": run, "run_calls": run_calls, "export": export, "kernels": kernels, "export_ethosu": export_ethosu,
                "cortex_m_op": cortex_m_op, "cortex_m_export": cortex_m_export,
                "cortex_m_schemas": cortex_m_schemas, "bundled": bundled,
                "etdump": etdump, "bundle": bundle}
    for line in sys.stdin:
        request = json.loads(line)
        log = tempfile.TemporaryFile()
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(log.fileno(), 2)  # the C++ runtime logs its reasons to file descriptor 2
        try:
            command = commands[request.pop("command")]
            result = command(types.SimpleNamespace(**{"method": None, **request}))
        except Exception as e:  # the runtime's refusal is the answer we report
            sys.stderr.flush()
            log.seek(0)
            lines = [ln for ln in log.read().decode(errors="replace").splitlines() if "cpuinfo" not in ln]
            result = {"error": f"{type(e).__name__}: {e}", "log": lines[-30:]}
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            log.close()
        print(MARKER + json.dumps(result), flush=True)
    return {"served": True}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("load")
    p.add_argument("pte")
    p.add_argument("--method")
    p.set_defaults(func=load)
    p = sub.add_parser("run")
    p.add_argument("pte")
    p.add_argument("inputs")
    p.add_argument("outputs")
    p.set_defaults(func=run)
    p = sub.add_parser("export")
    p.add_argument("model_py")
    p.add_argument("out_pte")
    p.set_defaults(func=export)
    sub.add_parser("kernels").set_defaults(func=kernels)
    sub.add_parser("serve").set_defaults(func=serve)
    args = parser.parse_args()
    try:
        result, status = args.func(args), 0
    except Exception as e:  # the runtime's refusal is the answer we report
        result, status = {"error": f"{type(e).__name__}: {e}"}, 1
    sys.stdout.flush()
    print(MARKER + json.dumps(result), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
