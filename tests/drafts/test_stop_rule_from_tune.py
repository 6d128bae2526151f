"""What sr.tune measured reaches the datastore draft's stop rule without any experiment helper: tune gives the
draft it was handed the chosen setting's v(n), `Setting.apply` gives it to a draft made later, a hybrid passes
it to its datastore part, a draft's own costs win, and other drafts are left as they were."""
import torch

import specrepro as sr
from helpers import TINY_STORE
from specrepro.algorithm.sampling import SamplingConfig
from specrepro.drafts import Datastore, DatastoreDraft, HybridDraft, LookupDraft
from specrepro.drafts.datastore import extend_pass_costs
from specrepro.stats.toy import tiny_llama
from specrepro.tuning.tune import Setting

STEEP = {1: 2.0, 2: 3.0, 3: 4.0, 4: 5.0}  # every proposed token costs a whole pass: never worth proposing


def store_draft(vocab=5, **kw):
    return DatastoreDraft(Datastore(TINY_STORE, max_ngram=3), vocab, **kw)


def fake_setting(v):
    return Setting(target=None, lookahead=4, candidate=None, report={"name": "x", "costs": {"x": {"v": v}}})


def test_tune_gives_the_datastore_draft_it_was_handed_the_chosen_settings_costs(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECREPRO_HOME", str(tmp_path))  # tune's cache starts empty
    model = tiny_llama(0, vocab=16, layers=2)
    draft = store_draft(vocab=16)
    assert draft.pass_costs is None
    setting = sr.tune(model, draft=draft, acceptance=0.6, max_lookahead=3, threads=[1], reps=1, dtypes=["float32"],
                      backends=["eager"])
    measured = setting.report["costs"][setting.report["name"]]["v"]
    assert setting.pass_costs == dict(measured) and set(measured) == {1, 2, 3}
    assert draft.pass_costs == extend_pass_costs(measured, 64)  # trees past K get v extended linearly


def test_apply_reaches_a_draft_made_later_and_a_hybrids_datastore_part():
    setting = fake_setting(STEEP)
    later = store_draft()
    assert setting.apply(later) is later and later.pass_costs == extend_pass_costs(STEEP, 64)
    hybrid = HybridDraft(store_draft())
    setting.apply(hybrid)
    assert hybrid.fallback.pass_costs == extend_pass_costs(STEEP, 64)


def test_a_drafts_own_costs_win_and_other_drafts_are_unchanged():
    own = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}
    draft = store_draft(pass_costs=own)
    fake_setting(STEEP).apply(draft)
    assert draft.pass_costs == own
    lookup = LookupDraft(5)
    before = dict(vars(lookup))
    assert fake_setting(STEEP).apply(lookup) is lookup and vars(lookup) == before
    model_draft = tiny_llama(1, vocab=5, layers=1)  # a plain HF model as the draft: nothing to offer it to
    assert fake_setting(STEEP).apply(model_draft) is model_draft


def test_the_offered_costs_change_what_the_draft_proposes():
    seq = torch.tensor(TINY_STORE[0][:3])
    greedy = SamplingConfig(0.0)
    free_tokens, _ = store_draft().propose(seq, 4, greedy)
    ruled = fake_setting(STEEP).apply(store_draft())
    ruled_tokens, _ = ruled.propose(seq, 4, greedy)
    assert len(free_tokens) > 1  # without costs the match proposes several tokens
    assert len(ruled_tokens) < len(free_tokens)  # with every token costing a pass, the rule proposes fewer
