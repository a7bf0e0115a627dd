"""prune's rules are one ordered list (``rules.RULES``) and its options one constructor
(``PruneOptions.from_selectors``): a selector the CLI offers cannot lack its rule, nor the
constructor, nor run for another selector's option. No cache needed: these read the code."""

from __future__ import annotations

import inspect

import pytest

from cachedoctor import api
from cachedoctor.cli.prune import prune as prune_command
from cachedoctor.core.prune.actions import Selector
from cachedoctor.core.prune.options import PruneOptions
from cachedoctor.core.prune.rules import RULES

# A value for each selector that takes one; the others are flags.
VALUES = {"older-than": "2w", "max-size": "1GB", "module": "jit_*"}


def cli_selectors() -> set[str]:
    """The selectors ``cachedoctor prune`` offers: its options spelled as a plan's rule."""
    flags = {o[2:] for p in prune_command.params for o in p.opts if o.startswith("--")}
    return flags & {r.value for r in Selector}


def test_every_selector_the_cli_offers_has_a_rule_in_the_list() -> None:
    selectors = cli_selectors()
    assert len(selectors) == 10, selectors  # the ten of `prune --help`
    missing = selectors - {r.name for r in RULES}
    assert not missing, f"selectors without a rule in RULES: {sorted(missing)}"
    names = [r.name for r in RULES]
    assert len(names) == len(set(names)), names


@pytest.mark.parametrize("selector", sorted(cli_selectors()))
def test_a_selector_alone_runs_its_rule_and_no_other(selector: str) -> None:
    """The steps that always run aside, the selector's own rule runs (and the decode, exactly
    when that rule reads it), and no rule of another selector."""
    always = {r.name for r in RULES if r.selected(PruneOptions())}
    options = PruneOptions.from_selectors(
        **{selector.replace("-", "_"): VALUES.get(selector, True)}
    )
    ran = {r.name for r in RULES if r.selected(options)} - always
    rule = next(r for r in RULES if r.name == selector)
    assert ran == {selector} | ({"decode"} if rule.decodes else set()), ran
    assert selector not in always


# The rules that mark entries (an entry they mark is removed whole), and those of the files beside.
MARKING = {"module", "corrupt", "relocated", "stale-jax", "older-than", "duplicates", "max-size"}
BESIDE = {"orphan-atimes", "orphans", "repair", "xla-subcaches", "xla-subcaches-note", "foreign"}


def test_the_order_is_scope_decode_entry_rules_removals_files_beside_stats_bound() -> None:
    names = [r.name for r in RULES]
    at = names.index
    assert names[0] == "module" and names[-1] == "stats-bound"
    assert all(at(r.name) > at("decode") for r in RULES if r.decodes)
    assert max(at(n) for n in MARKING) == at("max-size")  # evicts among the entries left
    assert max(at(n) for n in MARKING) < at("remove-marked") < min(at(n) for n in BESIDE)
    assert set(names) == MARKING | BESIDE | {"decode", "remove-marked", "stats-bound"}


def test_the_cli_and_the_api_give_their_values_to_the_one_constructor() -> None:
    """Every option of ``prune`` that selects or tunes what it removes, and every argument of
    ``prune_plan``, is an argument of ``from_selectors`` (with the names Python spells)."""
    takes = set(inspect.signature(PruneOptions.from_selectors).parameters)
    not_options = {"directory", "do_apply", "as_json", "lock_timeout"}
    cli = {p.name for p in prune_command.params} - not_options
    assert cli == takes
    assert set(inspect.signature(api.prune_plan).parameters) - {"cache_dir"} <= takes


def test_from_selectors_reads_the_typed_values_and_keeps_their_spelling() -> None:
    typed = PruneOptions.from_selectors(
        older_than="2w",
        max_size="1GiB",
        module="jit_*",
        duplicates=True,
        stale_jax=True,
        stale_after="1h",
    )
    assert (typed.older_than_s, typed.max_size, typed.stale_after_s) == (14 * 86400, 2**30, 3600)
    spelled = ("older-than 2w", "max-size 1GiB", "module jit_*", "duplicates", "stale-jax")
    assert typed.selectors == spelled  # as `prune` spells its options, in its order
    by_number = PruneOptions.from_selectors(older_than=14 * 86400, max_size=2**30)
    assert (by_number.older_than_s, by_number.max_size) == (typed.older_than_s, typed.max_size)
    assert by_number.selectors == ("older-than 1209600", "max-size 1073741824")
    assert PruneOptions.from_selectors() == PruneOptions()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"older_than": "1y"}, "older_than: not a duration: '1y'"),
        ({"max_size": "lots"}, "max_size: not a size: 'lots'"),
        ({"max_size": True}, "max_size: not a size: True"),
        ({"stale_after": -1}, "stale_after: not a duration: -1"),
        ({"duplicates": "yes"}, "duplicates: expected True or False, not 'yes'"),
        ({"module": 5}, "module: expected a str or None, not 5"),
    ],
)
def test_from_selectors_names_the_argument_it_cannot_read(
    given: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        PruneOptions.from_selectors(**given)  # type: ignore[arg-type]
