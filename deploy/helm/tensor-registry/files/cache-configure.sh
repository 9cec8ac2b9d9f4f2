#!/bin/sh
# The cache tier's init step (templates/cache.yaml): deploy/nginx-cache.conf, shipped unchanged in
# the ConfigMap, written out with the three things that differ from compose's network: the
# origin (the api Service instead of compose's `api`), the DNS server (the pod's own, from
# resolv.conf, instead of Docker's 127.0.0.11) and the cache's size (the volume's, not 200g).
# Each is replaced where it appears exactly once, or the pod does not start: a changed file
# fails here, loudly, instead of running half-configured.
set -eu
source=${CACHE_CONF_SOURCE:-/etc/tensor-registry/nginx-cache.conf}
target=${CACHE_CONF_TARGET:-/etc/nginx/conf.d/default.conf}
resolv=${CACHE_RESOLV_CONF:-/etc/resolv.conf}
: "${CACHE_ORIGIN:?the api Service URL}" "${CACHE_MAX_SIZE:?nginx size, e.g. 90g}"

nameserver=$(awk '$1 == "nameserver" { print $2; exit }' "$resolv")
if [ -z "$nameserver" ]; then
    echo "cache-configure: no nameserver in $resolv" >&2
    exit 1
fi
case $nameserver in *:*) nameserver="[$nameserver]" ;; esac

for pattern in 'http://api:8000;' '^resolver 127\.0\.0\.11 ' ' max_size=200g '; do
    if [ "$(grep -c -- "$pattern" "$source")" != 1 ]; then
        echo "cache-configure: $source has no single line matching '$pattern'" >&2
        exit 1
    fi
done

sed -e "s|http://api:8000;|$CACHE_ORIGIN;|" \
    -e "s|^resolver 127\.0\.0\.11 |resolver $nameserver |" \
    -e "s| max_size=200g | max_size=$CACHE_MAX_SIZE |" \
    "$source" > "$target.tmp"
mv "$target.tmp" "$target"
echo "cache-configure: origin $CACHE_ORIGIN, resolver $nameserver, max_size $CACHE_MAX_SIZE"
