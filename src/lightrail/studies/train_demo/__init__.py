"""A small GPT trained on CPU with tensor, pipeline and data parallelism over explicit process groups.

The training workload of the end-to-end demo. Every communication goes through a group this module
creates with ``dist.new_group`` (never the default group), so a backend that wraps another one and
intercepts each collective and send/recv per group sees the whole job's traffic:

* **TP** (Megatron-style): column-parallel QKV and MLP-in, row-parallel attention-out and MLP-out;
  one all_reduce per row-parallel layer in forward (``_ReduceFromTP``) and one per column-parallel
  input in backward (``_CopyToTP``). Embedding, LayerNorms, row-parallel biases and the LM head are
  replicated across TP ranks (their gradients are identical there, so they need no TP reduction).
* **PP** (GPipe): every stage runs all microbatches forward, then all backward in reverse order,
  with blocking ``dist.send``/``dist.recv`` of activations and gradients to adjacent stages in the
  PP group (group-local ranks, which equal the stage index).
* **DP**: after backward each stage's gradients (and, on the last stage, the step loss) travel in
  one flat all_reduce over the DP group, then are divided by dp.

Ranks follow :class:`lightrail.workload.parallel.Layout` (Megatron order: tp fastest, then dp, then
pp), the same placement the simulator assumes. Parameters are drawn per (seed, layer, name) at full
size and sharded, and microbatch ``j`` of a step's global batch (``dp * microbatches`` microbatches,
replica ``d`` taking ``d*microbatches ...``) is drawn per (seed, step, j), so the model and data do
not depend on the layout: tp=pp=dp=1 with ``microbatches * dp`` microbatches computes the same
losses up to float reassociation. Runs are deterministic: the same config on the same backend
numerics gives bit-identical losses.

Rooms: ``config`` (settings, deterministic parameters and data, groups), ``model`` (GPT modules, tensor-parallel
autograd), ``optimizer`` (Adam), ``worker`` (one rank's training), ``elastic`` (the worker that survives failures),
``launch`` (starting the ranks, gathering results), ``prediction`` (the simulator's overhead for the same job),
``measure`` (train-demo: gloo beside lightrail beside the prediction; imported by name, not re-exported). This
package re-exports the public names of the others.
"""

from __future__ import annotations

from lightrail.studies.train_demo.config import DemoConfig, _bits
from lightrail.studies.train_demo.elastic import Failure, _woken_by, elastic_train_worker
from lightrail.studies.train_demo.launch import DemoRun, FailoverRun, Recovery, ReplicaRun, run_demo, run_failover_demo
from lightrail.studies.train_demo.worker import _Replica, train_worker

__all__ = ["DemoConfig", "ReplicaRun", "DemoRun", "train_worker", "run_demo", "Failure", "Recovery", "FailoverRun",
           "elastic_train_worker", "run_failover_demo", "_bits", "_Replica", "_woken_by"]
