"""The official recipe as data: read it (reader), resolve one deployment's launch with the provenance of
every argument and variable (resolve), write a profile from it (generate), and compare two versions (diff).

The recipe files are vendored under recipes/vllm-project/ (recipes/vllm-project/SOURCE.yml)."""
