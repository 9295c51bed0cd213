"""The per-node sampling loop: one POSIX sh script, run once over the node's existing connection.

The script prints one framed block per interval (``@@lm-begin`` ... ``@@lm-end``) holding raw
nvidia-smi CSV, /proc/net/dev, NIC speeds and flags, /proc/diskstats, whole block devices and
``df -P`` of the scratch path. It uses only what any GPU node has (sh, cat, df, sleep,
nvidia-smi); all interpretation happens on the console side in :mod:`backend.telemetry.parse`, so
a node never needs loadmaster installed and the parsers stay pure and testable.
"""

from __future__ import annotations

import shlex

BEGIN = "@@lm-begin"
END = "@@lm-end"

GPU_FIELDS = (
    "index,uuid,name,utilization.gpu,utilization.memory,memory.used,memory.total,temperature.gpu,power.draw,power.limit"
)

#: A block with more lines or bytes than this is a malformed sample: reported and dropped (a
#: runaway command on a node must not grow the console's memory). A real block is a few KB.
MAX_BLOCK_LINES = 20000
MAX_BLOCK_BYTES = 4 * 1024 * 1024
#: nvidia-smi's output is cut on the node past this many bytes (8 GPUs print about 1.5 KB), so a
#: driver printing 200 MB costs neither the link nor the console; the cut output lacks its
#: ``@@gpu-rc`` line, which marks the sample's GPU part malformed.
MAX_GPU_BYTES = 256 * 1024
#: How often (seconds) the sampler reads the kernel log for Xids: a read of the whole ring buffer
#: is cheap, but not free at every block.
XID_EVERY_S = 10.0

_SCRIPT = r"""
i={interval}; cs={centis}; smi={smi}; scratch={scratch}; n=0
while :; do
  up=; read -r up _ </proc/uptime 2>/dev/null
  n=$((n + 1))
  # The block is made whole, then written at once: one write (one SSH packet) per block, not
  # one per line, which is what the console pays for at fleet scale.
  blk=$(
  echo '@@lm-begin'
  echo "@@uptime $up"
  echo "@@boot $(cat /proc/sys/kernel/random/boot_id 2>/dev/null)"
  echo '@@gpu'
  if command -v "$smi" >/dev/null 2>&1; then
    {{ "$smi" --query-gpu={fields} --format=csv,noheader,nounits 2>&1; echo "@@gpu-rc $?"; }} | head -c {gpu_bytes}
    echo
  else
    echo '@@gpu-rc absent'
  fi
  echo '@@netdev'; cat /proc/net/dev 2>/dev/null
  echo '@@nic'
  for d in /sys/class/net/*; do
    [ -e "$d" ] || continue
    s=$(cat "$d/speed" 2>/dev/null) || s=-1; [ -n "$s" ] || s=-1
    f=; [ -e "$d/device" ] && f=${{f}}d; [ -e "$d/master" ] && f=${{f}}m
    [ -d "$d/bonding" ] && f=${{f}}b; [ -d "$d/bridge" ] && f=${{f}}r
    echo "${{d##*/}} $s ${{f:--}}"
  done
  echo '@@diskstats'; cat /proc/diskstats 2>/dev/null
  echo '@@block'
  for d in /sys/block/*; do
    [ -e "$d" ] || continue
    if [ -e "$d/device" ]; then echo "${{d##*/}} d"; else echo "${{d##*/}} -"; fi
  done
  echo '@@df'
  if [ -d "$scratch" ]; then df -P -k "$scratch" 2>&1; echo "@@df-rc $?"; else echo '@@df-rc missing'; fi
  # Xids: the driver writes them to the kernel log ("NVRM: Xid (PCI:0000:3b:00): 79, ...").
  # Every {xid_every}th block: the log's Xid lines and each GPU's PCI bus id, both cut short.
  if [ $((n % {xid_every})) -eq 1 ] || [ {xid_every} -eq 1 ]; then
    echo '@@xidbus'
    command -v "$smi" >/dev/null 2>&1 && "$smi" --query-gpu=index,pci.bus_id --format=csv,noheader 2>/dev/null | head -c 4096
    echo '@@xid'
    {{ dmesg 2>&1; echo "@@xid-rc $?"; }} | grep -a -e 'NVRM: Xid' -e '^@@xid-rc' -e 'dmesg:' | tail -n 33 | head -c 16384
  fi
  echo '@@lm-end'
  )
  printf '%s\n' "$blk"
  # Sleep what is left of the interval (builtins only: /proc/uptime in centiseconds), so the
  # period stays at the interval however long nvidia-smi took.
  now=; read -r now _ </proc/uptime 2>/dev/null
  case "$up$now" in
    *[!0-9.]*|'') sleep "$i" ;;
    *)
      a=${{up%.*}}${{up#*.}}; b=${{now%.*}}${{now#*.}}
      a=${{a#"${{a%%[!0]*}}"}}; b=${{b#"${{b%%[!0]*}}"}}
      r=$(( cs - (${{b:-0}} - ${{a:-0}}) ))
      [ "$r" -lt 5 ] && r=5
      sleep "$((r / 100)).$((r % 100 / 10))$((r % 10))" ;;
  esac
done
"""


def sampler_script(*, interval: float, scratch: str, nvidia_smi: str = "nvidia-smi") -> str:
    """The sh command that samples a node forever, one framed block per ``interval`` seconds."""
    body = _SCRIPT.format(
        interval=shlex.quote(f"{interval:g}"),
        centis=int(round(interval * 100)),
        smi=shlex.quote(nvidia_smi),
        scratch=shlex.quote(scratch),
        fields=GPU_FIELDS,
        gpu_bytes=MAX_GPU_BYTES,
        xid_every=max(1, round(XID_EVERY_S / interval)),
    )
    # Run by an explicit sh so the node's login shell (bash, zsh, fish) does not matter.
    return f"exec sh -c {shlex.quote(body)}"
