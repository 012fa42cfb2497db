"""Fixtures that write tiny image/mask folders (tens of pixels) in every supported format, and the check that no
test leaves a process running."""

import ctypes
import gc
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import labels, rgb, write

# A pytest-xdist worker (pyproject's addopts start two) computes on one thread, and so do the processes its tests
# start: two workers of two threads each on two cores spent much of their time waiting for a descheduled thread.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# The slow integration tests (torchrun, ONNX exports, compiles, the longest training runs and resumes): the fast loop
# `pytest -m "not slow"` leaves them out, the README's test command (and .ci/run) runs them too. Marked here by test
# function, measured with --durations: together they take about five sixths of the suite's time. The tests that share
# test_export.py's exported model are all here, so that the fast loop does not pay for the export either.
SLOW = {
    "tests/test_accumulate_crop.py::test_a_ctrl_c_inside_an_update_saves_its_start_and_the_resumed_run_redoes_it",
    "tests/test_accumulate_crop.py::test_accumulation_resumes_exactly_and_the_schedule_counts_updates",
    "tests/test_hooks.py::test_a_checkpoint_naming_a_hook_class_it_was_not_configured_with_imports_nothing",
    "tests/test_hooks.py::test_validation_and_best_pt_use_the_averaged_weights",
    "tests/test_train.py::test_config_errors_from_the_command_line",
    "tests/test_train.py::test_ctrl_c_writes_last_pt_and_the_run_resumes",
    "tests/test_adapters.py::test_masked_norm_is_batch_invariant_where_the_others_are_not",
    "tests/test_adapters.py::test_masked_model_exports_to_onnx",
    "tests/test_train_workflow.py::test_a_mid_epoch_checkpoint_of_two_processes_is_not_resumed_by_one",
    "tests/test_train_workflow.py::test_a_resume_on_other_data_is_refused_unless_asked_and_other_changes_are_said",
    "tests/test_train_workflow.py::test_a_lost_torchrun_peer_is_a_message_with_how_to_resume_not_a_traceback",
    "tests/test_adapter_runs.py::test_an_adapter_exports_to_onnx_and_matches_onnxruntime",
    "tests/test_adapter_runs.py::test_an_adapter_trains_from_yaml_and_resumes_to_the_same_bits",
    "tests/test_adapter_runs.py::test_an_adapter_with_masked_norms_trains_under_torchrun",
    "tests/test_bench_quality.py::test_quick_mode_trains_and_scores_every_recipe",
    "tests/test_export.py::test_export_writes_a_dynamic_model_and_prints_the_check",
    "tests/test_export.py::test_the_exported_model_serves_sizes_and_batches_it_was_not_traced_with",
    "tests/test_export.py::test_the_check_fails_with_a_clear_message_for_a_model_that_was_not_exported",
    "tests/test_export.py::test_the_readme_snippet_predicts_a_scan_with_onnxruntime_alone",
    "tests/test_export.py::test_without_onnxruntime_the_export_is_written_and_the_check_skipped_with_a_note",
    "tests/test_export.py::test_run_onnx_names_what_is_wrong_with_the_inputs_before_onnxruntime_does",
    "tests/test_any_model.py::test_export_of_any_model_matches_onnxruntime",
    "tests/test_train_workflow.py::test_a_second_run_into_a_folder_in_use_is_refused_and_the_first_completes",
    "tests/test_gpu_check.py::test_gpu_check_without_a_gpu_says_so_and_exits_2",
    "tests/test_hooks.py::test_exact_resume_with_ema_a_user_hook_and_accumulation_mid_epoch",
    "tests/test_host_syncs.py::test_at_most_one_device_read_per_training_step",
    "tests/test_hostile.py::test_a_resumed_checkpoint_cannot_make_srforge_import_code",
    "tests/test_hostile.py::test_mask_values_beyond_num_classes_are_a_message_naming_the_sample",
    "tests/test_hostile.py::test_resuming_a_copied_run_writes_into_the_copy",
    "tests/test_hostile_data.py::test_train_ends_with_status_2_and_the_sample_named",
    "tests/test_memory.py::test_a_run_that_ran_out_of_memory_resumes_exactly",
    "tests/test_memory.py::test_an_out_of_memory_batch_is_redone_in_parts_to_the_same_weights",
    "tests/test_memory.py::test_checkpointing_composes_with_compile",
    "tests/test_memory.py::test_checkpointing_gives_the_plain_steps_gradients",
    "tests/test_memory.py::test_checkpointing_lowers_the_measured_bytes_per_pixel",
    "tests/test_memory.py::test_out_of_memory_in_backward_leaves_no_trace_in_the_gradients",
    "tests/test_memory.py::test_the_probe_measures_a_cost_per_pixel_and_leaves_the_model_as_it_was",
    "tests/test_memory.py::test_the_run_goes_on_after_an_out_of_memory_step",
    "tests/test_memory.py::test_two_ranks_agree_on_the_smallest_auto_budget_and_on_a_lowered_one",
    "tests/test_memory_probe.py::test_the_probe_measures_the_activations_cost_even_where_small_inputs_peak_at_the_gradients",
    "tests/test_predict.py::test_kill_then_rerun_completes_the_set",
    "tests/test_predict.py::test_script_on_folder_zip_and_tar_equals_predict_scan_by_scan",
    "tests/test_predict_hostile.py::test_a_full_disk_is_named_and_exit_1",
    "tests/test_predict_hostile.py::test_an_input_that_is_not_a_file_or_folder_is_exit_2_at_once",
    "tests/test_predict_pipeline.py::test_rerun_with_another_world_size_after_a_kill_completes_the_set",
    "tests/test_predict_pipeline.py::test_two_processes_under_torchrun_give_the_masks_of_one_and_one_report",
    "tests/test_predict_workflow.py::test_a_killed_predict_leaves_no_decoding_worker_behind",
    "tests/test_predict_workflow.py::test_sigterm_and_ctrl_c_write_the_report_with_the_scans_not_reached_stopped",
    "tests/test_startup.py::test_torchvision_is_imported_for_a_jpeg_not_for_the_commands_or_pngs",
    "tests/test_train.py::test_compile_goes_inside_ddp_and_matches_eager_gradients",
    "tests/test_train.py::test_ddp_survives_data_generation_longer_than_the_collective_timeout",
    "tests/test_train.py::test_two_processes_with_torchrun_gloo",
    "tests/test_train_workflow.py::test_a_second_ctrl_c_while_last_pt_is_written_waits_for_the_write",
    "tests/test_train_workflow.py::test_an_interrupted_write_of_last_pt_says_what_last_pt_still_holds",
    "tests/test_train_workflow.py::test_sigterm_mid_epoch_writes_last_pt_and_the_resumed_run_is_bit_identical",
    "tests/test_unet.py::test_compiled_training_step_under_autocast_matches_eager",
    "tests/test_unet.py::test_torch_compile_traces_one_graph_for_varying_sizes",
}

PR_SET_CHILD_SUBREAPER = 36  # prctl(2): orphans of this process's descendants are re-parented to it, not to init
# How long a test's processes may take to end after it: a pool shutting down, a killed tree; a DataLoader gives its
# workers torch's MP_STATUS_CHECK_INTERVAL (5 s) to end before it terminates them.
LEFTOVER_WAIT_S = 10.0


def _adopt_orphans() -> None:
    """Make pytest the subreaper of everything the tests start (Linux): a worker whose parent a test killed is
    re-parented to pytest, where :func:`no_process_left_behind` sees it, instead of vanishing under init."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            pass


_adopt_orphans()


def _running_children() -> dict[int, list[int]]:
    """{parent pid: [child pid]} of every process still running (zombies, which have ended, left out), read from
    /proc/<pid>/stat: "pid (comm) state ppid ...", comm may hold spaces and parentheses."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):  # ended while we looked
            continue
        if fields[0] not in (b"Z", b"X"):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def _descendants(pid: int) -> set[int]:
    children, found, todo = _running_children(), set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Fail a test that leaves a process running: every descendant of pytest (children, their children, and
    orphans adopted by pytest) that was not there before the test must have ended within LEFTOVER_WAIT_S of its
    end. Processes of wider-scoped fixtures (set up before this one) are there before, so they are left alone.
    The leftovers are killed after being reported, so that they do not trouble the next tests."""
    if not os.path.isdir("/proc/self"):
        yield
        return
    before = _descendants(os.getpid())
    yield
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    left = _descendants(os.getpid()) - before
    if left:  # a DataLoader iterator caught in a reference cycle (an exception's traceback) ends its workers when
        gc.collect()  # collected: collect now rather than blame the test for the collector's timing
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left &= _descendants(os.getpid())
    if left:
        described = "; ".join(f"{pid}: {_command(pid)}" for pid in sorted(left))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        pytest.fail(f"{len(left)} process(es) still running {LEFTOVER_WAIT_S:.0f} s after the test: {described}")


@pytest.fixture
def make_pair(tmp_path):
    """make_pair(name, image_array, mask_array, image_suffix=".png", root=tmp_path) writes one pair."""

    def make(name, image, mask, image_suffix=".png", root=None, mode=None):
        root = Path(root or tmp_path)
        write(root / "images" / f"{name}{image_suffix}", image, mode)
        if mask is not None:
            write(root / "masks" / f"{name}.png", mask)
        return root

    return make


@pytest.fixture
def folder(make_pair):
    """Three RGB PNG pairs of different sizes with 3-class masks."""
    for i, (h, w) in enumerate([(12, 20), (16, 9), (7, 30)]):
        root = make_pair(f"scan_{i}", rgb(h, w, i), labels(h, w, seed=i))
    return root


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a slow integration test, left out by -m 'not slow' (the fast loop)")


# The longest test files, longest first, by their tests' summed time in one run of the suite (2026-12-03, two
# workers: seconds). pytest-xdist's loadfile hands a worker one file at a time, in the order of the collection
# (pyproject's addopts turn off its own reordering, which goes by the number of tests): with the long files first
# and the short ones last the two workers end within seconds of each other, where a long file drawn last kept one
# worker busy for half a minute after the other had finished.
LONGEST_FIRST = [
    "test_train.py",  # 71
    "test_adapter_runs.py",  # 65
    "test_unet.py",  # 37
    "test_train_workflow.py",  # 27
    "test_export.py",  # 27
    "test_memory.py",  # 26
    "test_predict_pipeline.py",  # 22
    "test_predict.py",  # 17
    "test_adapters.py",  # 11
    "test_hostile.py",  # 10
]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.split("[")[0] in SLOW:
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
