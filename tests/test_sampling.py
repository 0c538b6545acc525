"""The vectorised sampler: a row's draws depend only on its logits, seed and counter."""

from __future__ import annotations

import torch

from snapeval.decode.sampling import Sampling, sample_one, sample_tokens, uniform


def rows(n: int, **values):
    do_sample = torch.full((n,), values.get("do_sample", True))
    temperature = torch.full((n,), values.get("temperature", 1.0))
    top_p = torch.full((n,), values.get("top_p", 1.0))
    return do_sample, temperature, top_p


def test_uniform_numbers_are_uniform_and_differ_by_seed_and_counter():
    counter = torch.arange(50_000)
    u = uniform(torch.full_like(counter, 12345), counter)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.std()) - 12**-0.5) < 0.01
    histogram = torch.histc(u, bins=10, min=0, max=1) / len(u)
    assert (histogram - 0.1).abs().max() < 0.01
    other_seed = uniform(torch.full_like(counter, 12346), counter)
    assert float((u - other_seed).abs().mean()) > 0.2  # neighbouring seeds are unrelated
    assert uniform(torch.tensor([2**40 + 3]), torch.tensor([7])) != uniform(
        torch.tensor([3]), torch.tensor([7])
    )


def test_sampled_tokens_follow_the_distribution_and_top_p():
    n = 40_000
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().repeat(n, 1)
    seeds, counter = torch.full((n,), 9), torch.arange(n)
    drawn = sample_tokens(logits, *rows(n), seeds, counter)
    assert torch.allclose(
        torch.bincount(drawn, minlength=4) / n, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.01
    )
    nucleus = sample_tokens(logits, *rows(n, top_p=0.7), seeds, counter)  # keeps 0.5 and 0.3
    assert torch.allclose(
        torch.bincount(nucleus, minlength=4) / n, torch.tensor([0.625, 0.375, 0, 0]), atol=0.01
    )
    cold = sample_tokens(logits, *rows(n, temperature=0.05), seeds, counter)
    assert float((cold == 0).float().mean()) > 0.99


def test_a_rows_token_does_not_depend_on_its_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 500)
    do_sample = torch.tensor([True, False, True, True, False, True])
    temperature, top_p = torch.tensor([0.7, 1, 1.3, 1, 1, 0.9]), torch.tensor([1, 1, 0.9, 0.5, 1, 1.0])
    seeds, counter = torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([0, 5, 9, 2, 2, 100])
    together = sample_tokens(logits, do_sample, temperature, top_p, seeds, counter).tolist()
    for row in range(6):
        sampling = Sampling(bool(do_sample[row]), float(temperature[row]), float(top_p[row]), int(seeds[row]))
        assert sample_one(logits[row], sampling, int(counter[row])) == together[row]
    assert together[1] == int(logits[1].argmax()) and together[4] == int(logits[4].argmax())
