"""The documentation's links resolve and the commands it names exist (issue 33), and the
checker itself finds what it is meant to find (``tools/check_docs.py``)."""

from __future__ import annotations

import pytest

from tools import check_docs as cd

FILES = cd.doc_files()
# Pages that other branches of the same round add: until they are merged, a link to one of them
# is reported by the test below, not as a broken link (remove an entry once its page exists).
def test_the_user_docs_are_checked():
    names = {p.name for p in FILES}
    assert {"README.md", "index.md", "fine-tuning.md", "performance.md"} <= names


def test_every_relative_link_resolves():
    assert cd.check_links(FILES) == []


def test_every_command_answers_help():
    cmds = cd.commands(FILES, cd.cli_available())
    assert any(c.argv[0] == "ggopt" or "ggopt.cli.main" in c.argv for c in cmds)
    problems, skipped = cd.check_commands(cmds)
    assert problems == []
    if skipped:
        pytest.skip(f"{len(skipped)} `ggopt` commands not checked: ggopt.cli.main does not "
                    f"exist in this tree")


def test_links_and_anchors_are_checked(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# Page A\n\n## Speed `ggopt` (2 threads)\n\n## Speed `ggopt` (2 threads)\n\n"
        "```bash\n# not a heading\n```\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md) [ok](docs/a.md#speed-ggopt-2-threads) "
        "[ok](docs/a.md#speed-ggopt-2-threads-1) [ok](#top) [web](https://x.org/y)\n"
        "[gone](docs/b.md) [bad anchor](docs/a.md#not-a-heading) `[code](nowhere.md)`\n\n# Top\n")
    problems = cd.check_links(cd.doc_files(tmp_path), tmp_path.resolve())
    assert len(problems) == 2
    assert "no file 'docs/b.md'" in problems[0]
    assert "a.md has no heading #not-a-heading" in problems[1]


def test_commands_are_found_in_shell_blocks_and_inline_code(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "Run `ggopt finetune --model M --lora 8` or `python -m ggopt.examples.llm generate`.\n"
        "```bash\n$ GGOPT_X=1 mpiexec -n 2 -ppn 1 ggopt mnist train --arch fc \\\n"
        "    --data D  # comment --not-an-option\n"
        "pip install x && python -m bench.bench_llm --epochs 1\n"
        "python -m pytest tests\n```\n"
        "```python\nfrom ggopt import opt  # ggopt import is not a command\n```\n")
    found = {(c.argv, c.options) for c in cd.commands([doc], cli=True)}
    assert found == {
        (("-m", "ggopt.cli.main", "finetune"), frozenset({"--model", "--lora"})),
        (("-m", "ggopt.examples.llm", "generate"), frozenset()),
        (("-m", "ggopt.cli.main", "mnist", "train"), frozenset({"--arch", "--data"})),
        (("-m", "bench.bench_llm"), frozenset({"--epochs"}))}
    assert all(c.argv[0] == "ggopt" for c in cd.commands([doc], cli=False)
               if "finetune" in c.argv or "mnist" in c.argv)


def test_a_missing_command_or_option_is_a_problem():
    where = "x.md:1"
    cmds = [cd.Command(("-m", "ggopt.examples.llm", "generate"), frozenset({"--temp"}), where),
            cd.Command(("-m", "ggopt.examples.llm", "generate"), frozenset({"--no-such"}), where),
            cd.Command(("-m", "ggopt.no_such_module"), frozenset(), where),
            cd.Command(("ggopt", "finetune"), frozenset({"--lora"}), where),
            cd.Command(("ggopt", "finetune"), frozenset({"--no-such"}), where)]
    problems, skipped = cd.check_commands(cmds)
    assert len(problems) == 3 and skipped == []
    assert "has no option --no-such" in problems[0]
    assert "ggopt.no_such_module --help` exited 1" in problems[1]
    assert "`ggopt finetune` has no option --no-such" in problems[2]


def test_ggopt_commands_skip_in_a_tree_without_the_command(tmp_path):
    cmds = [cd.Command(("ggopt", "finetune"), frozenset(), "x.md:1")]
    problems, skipped = cd.check_commands(cmds, root=tmp_path)
    assert problems == [] and len(skipped) == 1 and "ggopt finetune" in skipped[0]
