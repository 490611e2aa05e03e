#!/usr/bin/env bash
# Measure examples/social_graph.yaml or examples/user_item.yaml on a planted graph
# (bench/planted_graphs.py), as a user follows the recipe, against PBG's defaults and the
# popularity baseline. Run from the repository root with bigembed on PATH:
#   flock -x /work/cpu.lock bash bench/planted_recipes.sh social      # or user_item
# Extra arguments are passed to `bigembed train` of the recipe (e.g. -p num_epochs=10).
# Social: the user itself is left out of its candidates (a filter file of self-pairs).
# Test edges ranked: the first $SAMPLE of the split's test file (full ranking over 200k users
# for all 77k test edges would take minutes per model on 2 cores).
set -euo pipefail
kind=$1; shift
SAMPLE=${SAMPLE:-10000}
LIMIT=${LIMIT:-330}  # seconds of training at most per model
PY=${PYTHON:-python}
if [ "$kind" = social ]; then
  dir=work/social; data=work/planted/follows.tsv; recipe=examples/social_graph.yaml
  pbg=bench/planted_social_pbg_defaults.yaml; split_args=(); base_args=(--same-type)
else
  dir=work/shop; data=work/planted/interactions.tsv; recipe=examples/user_item.yaml
  pbg=bench/planted_user_item_pbg_defaults.yaml; split_args=(--by-relation); base_args=()
fi
echo "== $(date -u +%H:%M:%S) generate, split, import ($kind)"; uptime
[ -f "$data" ] || $PY bench/planted_graphs.py "$kind" --output "$data"
if [ ! -d "$dir/entities" ]; then
  bigembed split "$data" --output "$dir/split" "${split_args[@]}" --keep-entities-in-train --seed 0
  bigembed import "$recipe" -p edge_paths=$dir/train,$dir/valid,$dir/test \
      "$dir/split/train.tsv" "$dir/split/valid.tsv" "$dir/split/test.tsv"
fi
head -n "$SAMPLE" "$dir/split/test.tsv" > "$dir/split/test_sample.tsv"
filters=("$dir/train" "$dir/valid" "$dir/test")
if [ "$kind" = social ]; then
  # nobody follows themselves: the self-pairs leave the user out of its own candidates
  cut -f1,3 "$dir/split/train.tsv" | tr '\t' '\n' | sort -u \
      | awk '{print $1 "\tfollows\t" $1}' > "$dir/split/self.tsv"
  filters+=("$dir/split/self.tsv"); base_args+=(--exclude-self)
fi
echo "== $(date -u +%H:%M:%S) recipe"; uptime
timeout "$LIMIT" bigembed train "$recipe" --no-progress "$@" || echo "train exit $?"
bigembed eval "$recipe" --version best --no-progress --edges "$dir/split/test_sample.tsv" \
    --filter-edges "${filters[@]}"
echo "== $(date -u +%H:%M:%S) PBG defaults"; uptime
timeout "$LIMIT" bigembed train "$pbg" --no-progress || echo "train exit $?"
bigembed eval "$pbg" --no-progress --edges "$dir/split/test_sample.tsv" --filter-edges "${filters[@]}"
echo "== $(date -u +%H:%M:%S) popularity"; uptime
$PY bench/popularity_baseline.py --train "$dir/split/train.tsv" \
    --known "$dir/split/valid.tsv" "$dir/split/test.tsv" --edges "$dir/split/test_sample.tsv" \
    "${base_args[@]}"
echo "== $(date -u +%H:%M:%S) done"; uptime
