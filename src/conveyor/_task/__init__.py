"""A task, from both sides: what the loop asks a worker and how any worker runs it.

Every kind of worker (processes, threads, Ray actors, ``num_workers=0`` in the training
thread) runs tasks with the same code, and the main process reads their answers with the
same words. Nothing here starts a process or touches a pipe.

- ``protocol``: the typed messages the loop and its workers say to each other (``Task``,
  ``BatchDone``, ``TaskFailed``...), ``WorkerStatus`` and ``Died``.
- ``runner``: :class:`TaskRunner`, fetch → leave out → collate; ``fetch`` turns a sampler
  output into samples, ``stream`` writes each sample into its row of the batch as it
  comes, ``outcomes`` what a task comes to (one value per outcome).
- ``supervision``: :class:`SupervisionPolicy`, the failure options the judges read.
- ``context``: where a user's own exception came from (``WorkerContext``, ``Culprit``;
  public as ``conveyor.errors``'s); ``rebuild``: a worker's exception rebuilt in the main
  process as an instance of its own type.
- ``dataset_calls``: the training loop's calls on the dataset between epochs
  (``set_epoch``...): recorded on the main process's object, replayed on each worker's copy.
- ``dataset_state``: one worker's part of a loader's state; ``compat``: names newer
  Pythons have (``assert_never`` for the exhaustive matches over messages).
"""
