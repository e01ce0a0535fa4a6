#!/usr/bin/env bash
# Lists the crate's public API, one line per item with its summary, from the rustdoc HTML of
# `cargo doc --no-deps` (default features). docs/architecture.md holds the list between the
# `public-api` markers; `scripts/public-api.sh --check` fails when it is out of date.
set -euo pipefail
cd "$(dirname "$0")/.."
doc="${CARGO_TARGET_DIR:-target}/doc/tpgrpo"
[[ -f "$doc/index.html" ]] || { echo "no $doc: run cargo doc --no-deps first" >&2; exit 1; }
list() {
  find "$doc" -name index.html | sort | xargs perl -0777 -ne '
    while (m{<dt><a class="(\w+)" href="[^"]*" title="\w+ ([\w:]+)">.*?</a>.*?</dt>(?:<dd>(.*?)</dd>)?}gs) {
      my ($kind, $path, $sum) = ($1, $2, $3 // "");
      $sum =~ s/<[^>]+>//g; $sum =~ s/\s+/ /g;
      $sum =~ s/&lt;/</g; $sum =~ s/&gt;/>/g; $sum =~ s/&quot;/"/g; $sum =~ s/&#39;/\x27/g;
      $sum =~ s/&amp;/&/g;
      $sum =~ s/^(.*?\.)(\s.*)?$/$1/;
      $path =~ s/^tpgrpo:://;
      print "- `$path` ($kind): $sum\n";
    }' | sort -u
}
if [[ "${1:-}" == "--check" ]]; then
  want=$(list)
  have=$(sed -n '/<!-- public-api:start -->/,/<!-- public-api:end -->/p' docs/architecture.md | grep '^- ' || true)
  if [[ "$want" != "$have" ]]; then
    diff <(echo "$have") <(echo "$want") >&2 || true
    echo "docs/architecture.md: the public API list is out of date (scripts/public-api.sh)" >&2
    exit 1
  fi
else
  list
fi
