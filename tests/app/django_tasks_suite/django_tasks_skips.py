"""The tests of Django's tests/tasks that test another backend's own behaviour, and why each
is skipped here (conftest.py marks them; README.md lists them)."""

from __future__ import annotations

_CLASS = "asserts the class of Django's own {} backend, where DelayQueueBackend stands"
_ON_COMMIT = (
    "DelayQueueBackend's ON_COMMIT defaults to True (docs/tasks.md): a task enqueued inside "
    "a transaction is sent when it commits, not at once"
)
SKIPPED = {
    "test_tasks.py::TaskTestCase::test_using_correct_backend": _CLASS.format("dummy"),
    "test_tasks.py::TaskTestCase::test_get_backend": _CLASS.format("dummy and immediate"),
    "test_dummy_backend.py::DummyBackendTestCase::test_using_correct_backend": _CLASS.format(
        "dummy"
    ),
    "test_dummy_backend.py::DummyBackendTestCase::test_refresh_result": (
        "fakes a run by changing the dummy backend's in-memory result "
        "(results[0].status = SUCCESSFUL); DelayQueueBackend reads results from Redis"
    ),
    "test_dummy_backend.py::DummyBackendTestCase::test_refresh_result_async": (
        "fakes a run by changing the dummy backend's in-memory result "
        "(results[0].status = SUCCESSFUL); DelayQueueBackend reads results from Redis"
    ),
    "test_dummy_backend.py::DummyBackendTransactionTestCase::"
    "test_doesnt_wait_until_transaction_commit_by_default": _ON_COMMIT,
    "test_immediate_backend.py::ImmediateBackendTestCase::test_using_correct_backend": (
        _CLASS.format("immediate")
    ),
    "test_immediate_backend.py::ImmediateBackendTestCase::test_throws_keyboard_interrupt": (
        "the immediate backend runs a task in the caller's thread, so a KeyboardInterrupt "
        "there is the caller's; runqueue runs it in a worker, where it fails the attempt as "
        "any BaseException does (the worker itself stops on SIGINT)"
    ),
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_get_result": (
        "the immediate backend keeps no results (supports_get_result = False); "
        "DelayQueueBackend keeps them in Redis"
    ),
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_refresh_result": (
        "the immediate backend keeps no results (supports_get_result = False); "
        "DelayQueueBackend keeps them in Redis"
    ),
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_pass_run_after": (
        "the immediate backend cannot defer a task (supports_defer = False); DelayQueueBackend can"
    ),
    "test_immediate_backend.py::ImmediateBackendTransactionTestCase::"
    "test_doesnt_wait_until_transaction_commit_by_default": _ON_COMMIT,
}
