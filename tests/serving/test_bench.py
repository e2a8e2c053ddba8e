"""The `vllm bench serve` command line and run folders."""

import datetime as dt
from pathlib import Path

import pytest

from mlabench.serving.bench import bench_command, new_run_dir
from mlabench.serving.config import BenchParams


def test_command_has_the_seed_flags_and_save_result():
    argv = bench_command("/v/bin/vllm", "http://h:1", "M", "T", BenchParams(), 16, Path("/r"),
                         "x.json", {"variant": "asm", "concurrency": "16"})
    s = " ".join(argv)
    assert argv[:3] == ["/v/bin/vllm", "bench", "serve"]
    for part in ("--backend vllm", "--base-url http://h:1", "--endpoint /v1/completions",
                 "--model M", "--tokenizer T", "--dataset-name random", "--random-input-len 100000",
                 "--random-output-len 1000", "--random-range-ratio 0.0", "--max-concurrency 16",
                 "--num-prompts 16", "--num-warmups 1", "--seed 0", "--request-rate inf",
                 "--ignore-eos", "--trust-remote-code", "--disable-tqdm", "--save-result",
                 "--result-dir /r", "--result-filename x.json"):
        assert part in s, part
    assert argv[-3:] == ["--metadata", "variant=asm", "concurrency=16"]
    # the seed's 3 prompts at concurrency 1; at 16 one prompt per slot (3 would run 3 at once)
    one = bench_command("vllm", "u", "M", "M", BenchParams(), 1, Path("/r"), "f", {"variant": "a"})
    assert one[one.index("--num-prompts") + 1] == "3"


def test_overrides_and_pass_through():
    p = BenchParams(random_input_len=64, ignore_eos=False, num_warmups=0, dataset_name="sharegpt",
                    extra_args=["--dataset-path", "/d.json"])
    argv = bench_command("vllm", "u", "M", "M", p, 1, Path("/r"), "f", {"variant": "a"})
    assert "--ignore-eos" not in argv and "--num-warmups" not in argv
    assert "--random-input-len" not in argv  # random flags only for the random dataset
    i = argv.index("--dataset-path")
    assert argv[i + 1] == "/d.json" and i < argv.index("--metadata")


def test_run_dirs_are_never_reused(tmp_path):
    now = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.timezone.utc)
    a = new_run_dir(tmp_path, "cfg", now)
    (a / "keep.json").write_text("{}")
    b = new_run_dir(tmp_path, "cfg", now)
    assert a.name == "serve-20261130T120000Z-cfg" and b.name == a.name + "-2"
    assert (a / "keep.json").exists()


def test_prompts_per_concurrency_reach_the_command():
    p = BenchParams(num_prompts={1: 3, 16: 16}, random_input_len=[4096, 100000])
    for conc, n in ((1, "3"), (16, "16")):
        argv = bench_command("vllm", "u", "M", "M", p.for_run(4096, conc), conc, Path("/r"), "f", {"variant": "a"})
        assert argv[argv.index("--num-prompts") + 1] == n and argv[argv.index("--random-input-len") + 1] == "4096"
    with pytest.raises(ValueError, match="one random_input_len"):
        bench_command("vllm", "u", "M", "M", p, 1, Path("/r"), "f", {"variant": "a"})


def test_a_variant_runs_only_its_own_concurrencies():
    from mlabench.serving.bench import bench_points
    from mlabench.serving.config import ServeConfig, Variant

    conf = ServeConfig(baseline="a", variants=[Variant(name="a", base_url="http://x"),
                                               Variant(name="b", base_url="http://y", concurrencies=[16])],
                       bench=BenchParams(random_input_len=[64, 128]))
    assert bench_points(conf, conf.variants[1]) == [(64, 16, 0), (128, 16, 0)]
    assert [p[1] for p in bench_points(conf, conf.variants[0])] == [1, 16, 1, 16]
    with pytest.raises(ValueError, match="variant 'b' runs at concurrencies \\[4\\], none of which"):
        ServeConfig(baseline="a", variants=[Variant(name="a", base_url="http://x"),
                                            Variant(name="b", base_url="http://y", concurrencies=[4])])


def test_warmups_per_concurrency_reach_the_command():
    """A full burst of warm-ups at c=16 (one-time costs out of the measured run), one at c=1."""
    p = BenchParams(num_warmups={1: 1, 16: 16}, random_input_len=[4096, 100000])
    for conc, n in ((1, "1"), (16, "16")):
        for params in (p.for_run(4096, conc), p.model_copy(update={"random_input_len": 4096})):  # the table too
            argv = bench_command("vllm", "u", "M", "M", params, conc, Path("/r"), "f", {"variant": "a"})
            assert argv[argv.index("--num-warmups") + 1] == n
    none = bench_command("vllm", "u", "M", "M", BenchParams(num_warmups={1: 0}, random_input_len=64), 1,
                         Path("/r"), "f", {"variant": "a"})
    assert "--num-warmups" not in none


def test_points_run_every_concurrency_of_a_length_before_the_next_length():
    from mlabench.run_files import bench_point_stem as result_stem
    from mlabench.serving.bench import bench_points
    from mlabench.serving.config import ServeConfig, Variant

    conf = ServeConfig(baseline="a", variants=[Variant(name="a", base_url="http://x")], repeats=2,
                       bench=BenchParams(random_input_len=[64, 128]))
    assert bench_points(conf, conf.variants[0])[:5] == [(64, 1, 0), (64, 1, 1), (64, 16, 0), (64, 16, 1), (128, 1, 0)]
    assert result_stem("a", 64, 16, 1, True) == "a-i64-c16-r1" and result_stem("a", 64, 16, 1, False) == "a-c16-r1"
