/* The limit kinds of limit_kinds.def, numbered for the C side: VGL_KIND_<id>
 * indexes vgl_limit_kind(); VGL_DEVICE_KINDS counts those given per device. */
#ifndef VGPULIMIT_LIMIT_KINDS_H
#define VGPULIMIT_LIMIT_KINDS_H

enum vgl_kind_id {
#define VGL_LIMIT_KIND(id, ...) VGL_KIND_##id,
#include "limit_kinds.def"
#undef VGL_LIMIT_KIND
    VGL_KINDS
};

enum {
    VGL_DEVICE_KINDS = 0
#define VGL_LIMIT_KIND(id, what, ours, hami, kai, flag, per_device, ...) + (per_device)
#include "limit_kinds.def"
#undef VGL_LIMIT_KIND
};

#endif
