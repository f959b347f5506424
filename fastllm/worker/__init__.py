"""The runner side of the scheduler boundary: request state, input packing, the model step."""
