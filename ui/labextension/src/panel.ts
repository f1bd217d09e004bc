/** The panel a click on the status item opens: the status body, laid out. Words are the server's. */

export interface INotice {
  kind: 'warning' | 'reclaimed';
  text: string;
  /** the notice in at most 140 characters (a notification's limit); the panel shows `text` */
  headline?: string;
  at: string;
  kernel_ids: string[];
  /** a warning that activity can prevent: false for a gpu_idle_limit stop or a GPU lease (no Keep) */
  keep?: boolean;
  /** a GPU lease its user may still extend: the hub's page where they do */
  extend_url?: string;
}

export interface ILease {
  ends_at: string;
  extensions_left: number;
  can_extend: boolean;
  words: string;
  extend_url: string;
}

export interface IDevice {
  index: number;
  name: string;
  uuid: string;
  memory_used_bytes: number;
  memory_total_bytes: number;
  utilization_percent: number | null;
}

export interface IStatus {
  offering: { slug: string; display_name: string; kind: string; count: number | null; words: string } | null;
  devices: IDevice[] | { unavailable: string };
  culler: {
    idle_since: string | null;
    action: 'kernels' | 'server' | null;
    act_at: string | null;
    reason: string;
    warning: boolean;
    keepable: boolean;
    limit_seconds: number | null;
    posted_at: string;
  } | null;
  notices: INotice[];
  lease?: ILease | null;
  summary: string;
  now: string;
}

const GIB = 2 ** 30;

function row(table: HTMLTableElement, name: string, value: string): void {
  if (!value) {
    return;
  }
  const tr = table.insertRow();
  const th = document.createElement('th');
  th.textContent = name;
  tr.appendChild(th);
  tr.insertCell().textContent = value;
}

function when(iso: string | null): string {
  return iso ? new Date(iso).toLocaleString() : '';
}

export function panelNode(status: IStatus): HTMLElement {
  const node = document.createElement('div');
  node.className = 'gpuspawner-panel';
  const summary = document.createElement('p');
  summary.className = 'gpuspawner-panel-summary';
  summary.textContent = status.summary;
  node.appendChild(summary);
  for (const notice of status.notices) {
    const p = document.createElement('p');
    p.className = `gpuspawner-notice gpuspawner-notice-${notice.kind}`;
    p.textContent = notice.text;
    node.appendChild(p);
  }
  const table = document.createElement('table');
  const offering = status.offering;
  row(table, 'Offering', offering ? offering.display_name : 'none (not started with a GPU offering)');
  row(table, 'What it gives', offering ? offering.words : '');
  if (Array.isArray(status.devices)) {
    for (const d of status.devices) {
      const util = d.utilization_percent === null ? 'utilisation not reported' : `${d.utilization_percent} % busy`;
      const mem = `${(d.memory_used_bytes / GIB).toFixed(1)} / ${(d.memory_total_bytes / GIB).toFixed(1)} GB`;
      row(table, `GPU ${d.index}`, `${d.name}: ${mem}, ${util}`);
    }
  } else {
    row(table, 'GPU figures', `unavailable: ${status.devices.unavailable}`);
  }
  const culler = status.culler;
  if (culler) {
    row(table, 'Idle since', culler.idle_since ? when(culler.idle_since) : 'not idle');
    const next = culler.action && culler.act_at ? `${culler.action === 'kernels' ? 'idle kernels reclaimed' : 'server stopped'} at ${when(culler.act_at)}` : 'nothing planned';
    row(table, 'Next', next);
    row(table, 'Why', culler.reason);
    row(table, 'Idle limit', culler.limit_seconds === null ? '' : `${Math.round(culler.limit_seconds / 60)} min`);
  } else {
    row(table, 'Idle culler', 'has not reported on this server yet');
  }
  node.appendChild(table);
  if (status.lease) {
    const p = document.createElement('p');
    p.className = 'gpuspawner-lease';
    p.textContent = status.lease.words + ' ';
    if (status.lease.can_extend && status.lease.extend_url) {
      const a = document.createElement('a');
      a.href = status.lease.extend_url;
      a.target = '_blank';
      a.textContent = 'Extend it on the hub';
      p.appendChild(a);
    }
    node.appendChild(p);
  }
  return node;
}
