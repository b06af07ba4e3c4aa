# files.sh — sourced by check.sh (there) and prep.sh (here): the git-ignored model and texts
# that the model stage reads, so that what prep.sh carries is what check.sh looks for.
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf # the default model (scripts/setup.sh fetches it)
QMODEL=models/smollm2-w4axkv4                # its W4AxKV4 checkpoint (comet quantize)
# test_model_cuda and perplexity read the first, quantize's calibration the second
TEXTS=(data/austen/prideprejudice.txt data/mobydick.txt)
