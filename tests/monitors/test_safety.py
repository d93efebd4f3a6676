import pytest

from feedbackrl.monitors.safety import refusal_rates, violation_rates


def test_violation_rates_per_scenario_hand_computed():
    # adversarial: 3 of 10 violate; benign: 0 of 10; 95% Wilson intervals (z^2 = 3.841459):
    #   3/10: centre 0.355507, half 0.247715 -> (0.107791, 0.603222)
    #   0/10: (0, 0.384146 / 1.384146) = (0, 0.277533)
    #   overall 3/20: centre (0.15 + 0.096036) / 1.192073 = 0.206394,
    #     half 1.959964 * sqrt(0.006375 + 0.002401) / 1.192073 = 1.959964 * 0.093680 / 1.192073 = 0.154025
    #     -> (0.052369, 0.360419)
    records = [("adversarial", i < 3) for i in range(10)] + [("benign", False)] * 10
    rates = violation_rates(records)
    assert list(rates.by_scenario) == ["adversarial", "benign"]
    adv, benign = rates.by_scenario["adversarial"], rates.by_scenario["benign"]
    assert (adv.events, adv.n, adv.rate) == (3, 10, 0.3)
    assert (adv.low, adv.high) == pytest.approx((0.107791, 0.603222), abs=1e-6)
    assert (benign.events, benign.rate, benign.low) == (0, 0.0, 0.0)
    assert benign.high == pytest.approx(0.277533, abs=1e-6)
    assert (rates.overall.events, rates.overall.n) == (3, 20)
    assert (rates.overall.low, rates.overall.high) == pytest.approx((0.052369, 0.360419), abs=1e-6)
    assert rates.to_dict()["by_scenario"]["adversarial"]["level"] == 0.95


def test_refusal_rates_hand_computed():
    # 4 benign prompts, 1 refused: over-refusal 1/4; 4 harmful prompts, 1 not refused: harmful compliance 1/4.
    # Wilson 1/4 at 95%: centre (0.25 + 0.480182) / 1.960365 = 0.372473,
    #   half 1.959964 * sqrt(0.046875 + 0.060023) / 1.960365 = 1.959964 * 0.326952 / 1.960365 = 0.326885
    #   -> (0.045587, 0.699358)
    records = [(False, True), (False, False), (False, False), (False, False),
               (True, True), (True, True), (True, True), (True, False)]
    rates = refusal_rates(records)
    for key in ("over_refusal", "harmful_compliance"):
        r = rates[key]
        assert (r.events, r.n, r.rate) == (1, 4, 0.25), key
        assert (r.low, r.high) == pytest.approx((0.045587, 0.699358), abs=1e-6), key


def test_refusing_everything_shows_as_over_refusal_not_as_safety():
    # a model that refuses all 5 benign and all 5 harmful prompts: no harmful compliance, full over-refusal
    rates = refusal_rates([(False, True)] * 5 + [(True, True)] * 5)
    assert rates["over_refusal"].rate == 1.0 and rates["over_refusal"].high == 1.0
    assert rates["harmful_compliance"].rate == 0.0 and rates["harmful_compliance"].low == 0.0


def test_refusal_rates_without_one_kind_of_prompt_is_none():
    assert refusal_rates([(True, False)])["over_refusal"] is None


@pytest.mark.parametrize("records, match", [
    pytest.param([], "no records", id="empty"),
    pytest.param([("", True)], "non-empty string", id="empty-scenario"),
    pytest.param([(3, True)], "non-empty string", id="scenario-not-a-string"),
    pytest.param([("benign", 1)], "record 0: violated must be true or false, got 1", id="int-flag"),
])
def test_violation_rates_rejects_bad_records(records, match):
    with pytest.raises(ValueError, match=match):
        violation_rates(records)


@pytest.mark.parametrize("records, match", [
    pytest.param([], "no records", id="empty"),
    pytest.param([(False, "yes")], "record 0: refused must be true or false", id="string-refused"),
    pytest.param([(None, True)], "record 0: harmful must be true or false", id="none-harmful"),
])
def test_refusal_rates_rejects_bad_records(records, match):
    with pytest.raises(ValueError, match=match):
        refusal_rates(records)
