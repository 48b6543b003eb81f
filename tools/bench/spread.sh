# Sourced by the benchmark scripts. spread FORMAT VALUE... prints FORMAT (awk printf) with the
# median, min, max and count of the values, in that order; the median of an even count is the mean
# of the middle two.
spread() {
  local format=$1
  shift
  printf '%s\n' "$@" | sort -g | awk -v f="$format" '{ v[NR] = $1 } END {
    med = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf f, med, v[1], v[NR], NR }'
}
