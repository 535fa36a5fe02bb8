/* lib/maps.h: the pinned maps of kproxy.h's KP_MAPS table, declared for every program that
 * includes it. bcc opens a map already pinned at the path (a restarted agent adopts it,
 * entries and all) and creates and pins it otherwise. KP_PIN_DIR is the agent's bpffs
 * directory; the pin name is <name>_v<version>, so a layout change never meets an old map. */
#ifndef KPROXY_LIB_MAPS_H
#define KPROXY_LIB_MAPS_H

#include "../kproxy.h"

#ifndef KP_PIN_DIR
#error "KP_PIN_DIR must name the bpffs directory for the pinned maps"
#endif

#define KP_DECLARE_MAP(id, name, version, type, key, value, size, flags) \
	BPF_TABLE_PINNED(#type, key, value, name, size, KP_PIN_DIR "/" #name "_v" #version, flags);

KP_MAPS(KP_DECLARE_MAP)

#endif
