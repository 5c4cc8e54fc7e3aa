"""Prepare the throwaway copy made by `run.sh` for mutmut (never run it in the
working tree): point `[tool.mutmut]` at the chosen modules and tests, and drop the
jaxtyping import hook, which cannot be installed twice in one process (mutmut runs
pytest repeatedly in forked workers; the hook's own tests are not mutated here)."""

import os
import pathlib
import re
import sys


# Test files run against every mutant, without their `slow` tests (subprocesses
# import the installed package, not the mutant; the rest is too slow per mutant)
# but with the `large` ones, quick without the runtime type checks.
TESTS = [
    "tests/test_key.py",
    "tests/test_update.py",
    "tests/test_edit.py",
    "tests/test_module.py",
    "tests/test_validate.py",
    "tests/test_explain.py",
    "tests/test_typecheck.py",
    "tests/test_jit.py",
    "tests/test_aot.py",
    "tests/test_donate.py",
    "tests/test_transforms.py",
]
# Added when one of these modules is mutated.
EXTRA = {
    "_compile": [
        "tests/test_cache.py",
        "tests/test_programs.py",
        "tests/test_threads.py",
        "tests/test_sharing.py",
        "tests/test_books.py",
        "tests/test_locks.py",
        "tests/test_budget.py",
        "tests/test_errors.py",
        "tests/test_retrace.py",
        "tests/test_fallback.py",
        "tests/test_signatures.py",
    ],
    "_report": [
        "tests/test_budget.py",
        "tests/test_errors.py",
        "tests/test_where.py",
        "tests/test_porting.py",
        "tests/test_books.py",
    ],
    "_jit": ["tests/test_cache.py", "tests/test_binding.py", "tests/test_locks.py"],
    "_key": [
        "tests/test_key.py",
        "tests/test_keys_deep.py",
        "tests/test_guards.py",
        "tests/test_cache.py",
        "tests/test_binding.py",
        "tests/test_explain.py",  # `first_class`: a method's class, in reports
        "tests/test_donate.py",  # `leaves_of_first`: what "all-except-first" keeps
    ],
    "_fields": ["tests/test_keys_deep.py", "tests/test_guards.py"],
    "_guard": [
        "tests/test_guards.py",
        "tests/test_signatures.py",
        "tests/test_keys_deep.py",
        "tests/test_cache.py",
        "tests/test_binding.py",
    ],
    "_sharing": [
        "tests/test_sharing.py",
        "tests/test_programs.py",
        "tests/test_books.py",
        "tests/canary/test_jax_lowering.py",
        "tests/test_errors.py",  # `host_callbacks`: a program waited for
    ],
    "_module": ["tests/test_porting.py"],
    "_update": ["tests/test_porting.py"],
    "_jax": [
        "tests/test_fallback.py",
        "tests/test_sharing.py",
        "tests/test_books.py",
        "tests/test_environment.py",  # `env_switch`, `env_seconds`
        "tests/canary/test_jax_lowering.py",  # `callbacks_in`
        "tests/test_errors.py",  # `callbacks_in`: a program waited for
    ],
}

# Tests that read the package's own code objects (a trace function keyed on a
# function's name, the code of a wrapped function, the frames of a traceback or of
# an `eqx.error_if` stack):
# mutmut's trampolines replace them, so these fail on the unmutated copy.
DESELECT = {
    "_compile": [
        "tests/test_books.py::test_an_interrupt_right_after_a_program_is_marked_leaves_no_mark",
        "tests/test_budget.py::test_a_function_wrapped_anew_in_a_loop_is_told_once",
        "tests/test_errors.py::test_a_traced_field_error_shows_no_internals",
        # On the public path, the stack an `eqx.error_if` failure shows is cut at
        # the call's own frame; in the mutated copy it is not, unmutated too.
        "tests/test_errors.py::test_a_method_raises_with_the_message_and_the_stack_inside",
    ],
}
# The same frames hold the trampolines of the other modules whose runs take them.
DESELECT["_jax"] = DESELECT["_sharing"] = [
    t for t in DESELECT["_compile"] if t.startswith("tests/test_errors.py")
]

modules = [m.removesuffix(".py") for m in sys.argv[1:]]
# MUTATION_TESTS=own: only the modules' own test files (EXTRA), to score a module
# by the tests written for it, in a fraction of the time; or the test files named
# (`MUTATION_TESTS='tests/test_environment.py tests/test_errors.py'`), for a few
# functions whose tests are known.
chosen = os.environ.get("MUTATION_TESTS", "")
if chosen not in ("", "own"):
    tests = chosen.split()
else:
    base = [] if chosen == "own" else TESTS
    tests = base + [t for m in modules for t in EXTRA.get(m, []) if t not in base]
tests = [t for t in dict.fromkeys(tests) if pathlib.Path(t).exists()]
tests += [f"--deselect={t}" for m in modules for t in DESELECT.get(m, [])]

path = pathlib.Path("pyproject.toml")
text = path.read_text()
text = re.sub(r"^addopts = .*$", 'addopts = "-p no:cacheprovider"', text, flags=re.M)
section = re.search(r"^\[tool\.mutmut\]\n(?:(?!^\[).*\n?)*", text, flags=re.M)
assert section, "pyproject.toml has no [tool.mutmut] section"
body = section.group(0)
body = re.sub(
    r"^only_mutate = .*$",
    "only_mutate = " + repr([f"eqx_static/{m}.py" for m in modules]).replace("'", '"'),
    body,
    flags=re.M,
)
body = re.sub(
    r"^pytest_add_cli_args_test_selection = .*$",
    "pytest_add_cli_args_test_selection = " + repr(tests).replace("'", '"'),
    body,
    flags=re.M,
)
path.write_text(text.replace(section.group(0), body))
print("mutating:", ", ".join(modules))
print("tests:", " ".join(tests))
