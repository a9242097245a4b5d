# In-image checks of the verl-cpu image, run by `grpo-deploy images verify verl-cpu` as `bash -c` inside the image
# with EXPECT_UID, EXPECT_GID and MODEL (the image's labels) in the environment.
set -euo pipefail
echo "id: $(id)"
[[ $(id -u) == "$EXPECT_UID" && $(id -g) == "$EXPECT_GID" && $(id -un) == grpo ]] ||
  { echo "FAIL: expected user grpo $EXPECT_UID:$EXPECT_GID"; exit 1; }
[[ $HOME == /home/grpo && -w $HOME ]] || { echo "FAIL: HOME $HOME not writable"; exit 1; }
[[ $(umask) == 0022 ]] || { echo "FAIL: umask $(umask)"; exit 1; }
python3 -c 'import verl, transfer_queue, ray, vllm, torch, peft, hydra
print("imports: verl", verl.__version__, "ray", ray.__version__, "vllm", vllm.__version__, "torch", torch.__version__)'
python3 -c 'import verl
from verl.plugin.platform.platform_manager import PlatformRegistry
assert PlatformRegistry.get("cpu") is not None, "the kit platform is not registered"
print("verl platform: cpu registered by the kit plugin")'
python3 -c 'from vllm.platforms import current_platform as p; assert p.is_cpu(), p; print("vllm platform:", p.device_type)'
command -v ray >/dev/null && echo "ray cli: $(command -v ray)"
test -f "$MODEL/config.json" && echo "model: $MODEL"
python3 -m grpo_deploy.runtime.serving.cpu_lora_fix
echo "verify: all checks passed"
