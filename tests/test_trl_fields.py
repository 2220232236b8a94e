"""Every field of the installed TRL's GRPOConfig, RLOOConfig, DPOConfig, SFTConfig and RewardConfig has a rule in
lmrl.trl.fields (carried, no effect, refused); the carried ones are the ones the translation reads;
every field at TRL's default is accepted; docs/trl-fields.md is the table as the code has it."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmrl.trl import fields as table
from lmrl.trl.configs import TRANSLATED, DPOConfig, GRPOConfig, RewardConfig, RLOOConfig, SFTConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "trl-fields.md"
CONFIGS = {cls.kind: cls for cls in (GRPOConfig, RLOOConfig, DPOConfig, SFTConfig, RewardConfig)}


@pytest.mark.parametrize("kind", table.KINDS)
def test_every_field_of_the_installed_trl_has_a_rule(kind):
    rules = table.rules(kind)
    missing = [f.name for f in table.trl_fields(kind) if f.name not in rules]
    assert not missing, f"TRL's {kind} fields without a rule in lmrl/trl/fields.py: {missing}"


@pytest.mark.parametrize("kind", table.KINDS)
def test_the_carried_fields_are_the_ones_the_translation_reads(kind):
    names = {f.name for f in table.trl_fields(kind)}
    carried = {n for n in names if table.rules(kind)[n].effect == table.CARRIED}
    assert carried == (TRANSLATED["common"] | TRANSLATED[kind]) & names


@pytest.mark.parametrize("kind", table.KINDS)
def test_every_field_at_trls_default_is_accepted(kind, tmp_path):
    args = CONFIGS[kind](output_dir=str(tmp_path), use_cpu=True)
    assert args.given == {"output_dir": str(tmp_path), "use_cpu": True} and args.ignored == []
    args.to_config(model_path="m", train_rows=64)


@pytest.mark.parametrize("kind", table.KINDS)
def test_trls_command_line_at_its_defaults_sets_nothing(kind, tmp_path):
    from lmrl.trl import TrlParser

    (args,) = TrlParser((CONFIGS[kind],)).parse_args_and_config(["--output_dir", str(tmp_path), "--use_cpu"])
    assert args.given == {"output_dir": str(tmp_path), "use_cpu": True} and args.ignored == []


def test_the_fields_tables_cover_every_config_class_lmrl_trl_exports():
    import lmrl.trl as shim

    assert set(table.KINDS) == set(CONFIGS)
    assert {table.NAMES[kind] for kind in table.KINDS} == {name for name in shim.__all__ if name.endswith("Config")
                                                          and name not in ("ModelConfig", "DatasetMixtureConfig")}


def test_the_docs_table_is_generated_from_the_code():
    assert DOC.read_text() == table.markdown(), "regenerate: python -m lmrl.trl.fields > docs/trl-fields.md"
