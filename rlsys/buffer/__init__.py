"""The streaming buffer between the pipeline and the learner (``streaming``), and the replay
store that feeds it old samples (``replay``)."""
