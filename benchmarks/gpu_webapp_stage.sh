#!/usr/bin/env bash
# On a held GPU machine: keep part N of the web app's wheels (.webwhl/N, made here by
# benchmarks/gpu_webapp_wheels.sh and carried by this call) in the stage folder, where the next
# call finds it; once every part is there, put the tar together, check its sha256, and install the
# wheels into the stage's site folder, which `gpu_session.sh webapp` adds to the path (issue 45,
# item 6). Each call must come within the machine's idle time (about 30 s), or it starts bare.
#
#   bash benchmarks/gpu_webapp_stage.sh N
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:?usage: gpu_webapp_stage.sh PART_NUMBER}
STAGE=${WEBAPP_STAGE_DIR:-/tmp/streamstudio-webapp-stage}
mkdir -p "$STAGE/parts"
PARTS=${WEBAPP_PARTS_DIR:-.webwhl}  # where this call carried the parts (.webwhl/N)
[ -f "$PARTS/$N/part" ] || { echo "no $PARTS/$N/part here: carry .webwhl/$N with this call" >&2; exit 2; }
cp "$PARTS/$N/part" "$STAGE/parts/$(printf '%02d' "$N")"
cp "$PARTS/$N/manifest.json" "$STAGE/manifest.json"
read -r parts sum < <(python3 -c "
import json, sys
m = json.load(open(sys.argv[1])); print(m['parts'], m['sha256'])" "$STAGE/manifest.json")
have=$(ls "$STAGE/parts" | wc -l)
echo "web app wheels: part $N kept; $have of $parts here ($STAGE)"
[ "$have" -ge "$parts" ] || exit 0
cat "$STAGE"/parts/* > "$STAGE/wheels.tar"
got=$(sha256sum "$STAGE/wheels.tar" | cut -d' ' -f1)
[ "$got" = "$sum" ] || { echo "the parts do not make the tar that was cut (sha256 $got, not $sum)" >&2; exit 1; }
rm -rf "$STAGE/wheels" "$STAGE/site"
mkdir -p "$STAGE/wheels"
tar -C "$STAGE/wheels" -xf "$STAGE/wheels.tar"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$STAGE/site" "$STAGE"/wheels/*.whl
rm -rf "$STAGE/parts" "$STAGE/wheels.tar" "$STAGE/wheels"
touch "$STAGE/ready"
echo "web app wheels installed in $STAGE/site ($(ls "$STAGE/site" | wc -l) entries)"
