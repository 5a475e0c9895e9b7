"""Values reported inside a layer stack come out per layer, under jit, remat, grad and shard_map, equal to the
values computed outside; without a collector the program is the same as without the reports."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance
from jax.sharding import Mesh, PartitionSpec

import halyard.named as hn
from halyard.named import Axis, NamedArray, ReportingError
from halyard.named.nn import Stacked

Embed, Layers, Batch = Axis("embed", 4), Axis("layers", 4), Axis("batch", 16)
# Up to the last layer's output: each layer's dot product and tanh, in float32 here and in numpy in its order.
FORWARD_TERMS = Layers.size * (Embed.size + FUNCTION_TERMS)


class Layer(eqx.Module):
    weight: NamedArray
    reports: bool = eqx.field(static=True, default=True)

    @classmethod
    def init(cls, *, key, reports=True):
        return cls(NamedArray(jax.random.normal(key, (4, 4)) / 2, (Embed, Axis("out", 4))), reports)

    def __call__(self, x, kind=None):
        y = hn.tanh(hn.dot(x, self.weight, axis="embed").rename({"out": "embed"}))
        if self.reports:
            hn.report("act/rms", jnp.sqrt(jnp.mean(jnp.square(y.array))), reduce="rms")
            hn.report("act/max", jnp.max(y.array), reduce="max")
            hn.report("act/sum", jnp.sum(y.array), reduce="sum")
        return y


def outside(stack, x):
    """Per layer (rms, max, sum) computed with numpy, running the layers one by one."""
    rms, top, total = [], [], []
    h = np.asarray(x.array)
    for layer in stack.layers():
        h = np.tanh(h @ np.asarray(layer.weight.array))
        rms.append(np.sqrt(np.mean(h**2)))
        top.append(h.max())
        total.append(h.sum())
    return np.array(rms), np.array(top), np.array(total)


def assert_equal_to_outside(values: dict, expected: tuple) -> None:
    """The reported ``(rms, max, sum)`` per layer equal `outside`'s to the order of their sums: the forward's,
    then the mean's or the sum's over the batch's values (tanh's, within 1, of both signs for the sum)."""
    rms, top, total = expected
    count = Batch.size * Embed.size
    rms_bound = summation_tolerance(rms, FORWARD_TERMS + count + FUNCTION_TERMS)
    np.testing.assert_allclose(values["act/rms/layers"], rms, atol=rms_bound, rtol=0)
    top_bound = summation_tolerance(top, FORWARD_TERMS)
    np.testing.assert_allclose(values["act/max/layers"], top, atol=top_bound, rtol=0)
    sum_bound = summation_tolerance(count, FORWARD_TERMS + count)
    np.testing.assert_allclose(values["act/sum/layers"], total, atol=sum_bound, rtol=0)


def inputs():
    return NamedArray(jax.random.normal(jax.random.PRNGKey(1), (16, 4)), (Batch, Embed))


@pytest.mark.parametrize("remat", ["none", "full", "save_dots", "nested"])
@pytest.mark.parametrize("unrolled", [False, True])
def test_a_layer_stack_reports_per_layer_under_jit_and_remat(remat, unrolled):
    stack = Stacked.init(Layers, Layer, key=jax.random.PRNGKey(0), remat=remat)
    run = stack.unrolled() if unrolled else stack
    x = inputs()
    out, reports = jax.jit(hn.collect_reports(lambda s, x: s.fold(x)))(run, x)
    values = reports.finished()
    assert sorted(values) == ["act/max/layers", "act/rms/layers", "act/sum/layers"]
    assert_equal_to_outside(values, outside(stack, x))
    folded = stack.fold(x).array  # another program
    np.testing.assert_allclose(out.array, folded, atol=summation_tolerance(folded, FORWARD_TERMS), rtol=0)


def test_a_pattern_of_kinds_reports_in_layer_order():
    stack = Stacked.init(Layers, Layer, key=jax.random.PRNGKey(0))
    x = inputs()
    _, reports = jax.jit(hn.collect_reports(lambda s, x: s.fold(x, kinds=("a", "b", "a", "b"))))(stack, x)
    top = outside(stack, x)[1]
    np.testing.assert_allclose(
        reports.finished()["act/max/layers"], top, atol=summation_tolerance(top, FORWARD_TERMS), rtol=0
    )


def test_without_a_collector_the_program_is_the_one_without_reports():
    reporting = Stacked.init(Layers, Layer, key=jax.random.PRNGKey(0), remat="full")
    silent = Stacked.init(Layers, lambda key: Layer.init(key=key, reports=False), key=jax.random.PRNGKey(0))
    silent = Stacked(silent.stacked, Layers, "full")
    x = inputs()
    grad = lambda s, x: jax.grad(lambda s: hn.sum(s.fold(x)).array)(s)
    assert str(jax.make_jaxpr(grad)(reporting, x)) == str(jax.make_jaxpr(grad)(silent, x))
    assert not hn.collecting_reports()
    hn.report("ignored", 1.0)  # no collector: nothing happens


def test_reports_leave_a_gradient_as_aux_and_microbatches_combine():
    stack = Stacked.init(Layers, Layer, key=jax.random.PRNGKey(0), remat="full")
    x = inputs()
    pieces = x.array.reshape(2, 8, 4)

    def loss(s, rows):
        rows = NamedArray(rows, (Axis("batch", 8), Embed))
        out, reports = hn.capture_reports(lambda: hn.sum(s.fold(rows)).array)()
        return out, reports

    def step(s):
        def body(total, rows):
            (value, reports), _ = jax.value_and_grad(loss, has_aux=True)(s, rows)
            return total + value, reports

        total, reports = jax.lax.scan(body, 0.0, pieces)
        reports.combined().emit()
        return total

    _, reports = jax.jit(hn.collect_reports(step))(stack)
    halves = [outside(stack, NamedArray(half, (Axis("batch", 8), Embed))) for half in pieces]
    values = reports.finished()
    # rms: the mean of the halves' mean squares, which for equal halves is the whole batch's
    combined = (outside(stack, x)[0], np.maximum(halves[0][1], halves[1][1]), halves[0][2] + halves[1][2])
    assert_equal_to_outside(values, combined)


def test_under_shard_map_on_8_devices_the_values_are_the_whole_batch():
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    stack = Stacked.init(Layers, Layer, key=jax.random.PRNGKey(0), remat="full")
    x = inputs()

    def per_device(s, rows):
        out, reports = hn.capture_reports(lambda: s.fold(NamedArray(rows, (Axis("batch", 2), Embed))))()
        return out.array, reports.across("data")

    sharded = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(PartitionSpec(), PartitionSpec("data")),
        out_specs=(PartitionSpec("data"), PartitionSpec()),
    )

    def run(s, rows):
        out, reports = sharded(s, rows)
        reports.emit()
        return out

    _, reports = jax.jit(hn.collect_reports(run))(stack, x.array)
    values = reports.finished()
    assert_equal_to_outside(values, outside(stack, x))


def test_a_report_that_cannot_be_carried_out_is_refused_by_name():
    stack = Stacked.init(Layers, Layer, key=jax.random.PRNGKey(0))
    x = inputs()
    in_vmap = lambda: jax.vmap(lambda w: hn.report("inside/vmap", jnp.sum(w)))(stack.stacked.weight.array)
    with pytest.raises(ReportingError, match="'inside/vmap'.*capture_reports"):
        jax.jit(hn.collect_reports(in_vmap))()
    with pytest.raises(ReportingError, match="reduce='median'"):
        hn.collect_reports(lambda: hn.report("x", 1.0, reduce="median"))()
    with pytest.raises(ReportingError, match="'twice' was reported 2 times"):
        hn.collect_reports(lambda: [hn.report("twice", 1.0), hn.report("twice", jnp.ones(2))])()
    with pytest.raises(ReportingError, match="inside a layer stack inside a layer stack"):
        hn.collect_reports(lambda: stack.fold(x))()[1].per_layer()


def test_the_same_name_twice_in_one_function_combines_and_rms_takes_the_root_once():
    _, reports = hn.collect_reports(
        lambda: [hn.report("m", 3.0, reduce="max"), hn.report("m", 5.0, reduce="max")]
    )()
    assert float(reports.finished()["m"]) == 5.0
    _, reports = hn.collect_reports(
        lambda: [hn.report("r", 3.0, reduce="rms"), hn.report("r", 4.0, reduce="rms")]
    )()
    rms = np.sqrt((9 + 16) / 2)  # float32: the squares' mean is exact, the square root rounds
    assert float(reports.finished()["r"]) == pytest.approx(
        rms, rel=0, abs=summation_tolerance(rms, FUNCTION_TERMS)
    )
