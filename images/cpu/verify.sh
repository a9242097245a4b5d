# In-image checks of the cpu image, run by `grpo-deploy images verify cpu` as `bash -c` inside the image with
# EXPECT_UID, EXPECT_GID and MODEL (the image's labels) in the environment.
set -euo pipefail
echo "id: $(id)"
[[ $(id -u) == "$EXPECT_UID" && $(id -g) == "$EXPECT_GID" && $(id -un) == grpo ]] ||
  { echo "FAIL: expected user grpo $EXPECT_UID:$EXPECT_GID"; exit 1; }
[[ $HOME == /home/grpo && -w $HOME ]] || { echo "FAIL: HOME $HOME not writable"; exit 1; }
[[ -O /shared ]] || { echo "FAIL: /shared is not owned by the run user"; exit 1; }
[[ $(umask) == 0022 ]] || { echo "FAIL: umask $(umask)"; exit 1; }
python3 -c 'import getpass; print("getpass:", getpass.getuser())'
python3 -c 'import vllm, trl, peft, torch, grpo_deploy
print("imports: vllm", vllm.__version__, "trl", trl.__version__, "peft", peft.__version__, "torch", torch.__version__)'
for dist in torchvision torchaudio torchcodec triton; do
  python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$dist') is not None)" ||
    { echo "FAIL: $dist is installed"; exit 1; }
done
echo "absent: torchvision torchaudio torchcodec triton"
python3 -m vllm.entrypoints.openai.api_server --help >/dev/null
echo "vllm api_server --help: ok"
test -f "$MODEL/config.json" && echo "model: $MODEL"
python3 -c 'import sys, transformers
c = transformers.AutoConfig.from_pretrained(sys.argv[1])
print("model config:", c.model_type, "head_dim", c.hidden_size // c.num_attention_heads)' "$MODEL"
python3 -m grpo_deploy.runtime.serving.cpu_lora_fix
echo "verify: all checks passed"
