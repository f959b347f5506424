"""Images and video: media loading, the per-architecture processor plugins, and their inputs."""
