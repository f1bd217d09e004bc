/**
 * Your GPU in JupyterLab's status bar (docs/user-gpu-view.md).
 *
 * Reads GET {base_url}api/gpuspawner/status (the gpuspawner.notebook_ext server
 * extension) every POLL_MS and shows its `summary` ("MIG 1g.10gb · 3.1 / 10 GB · idle
 * 24 min, kernels reclaimed in 6 min"); a click opens the panel with the details. While
 * the culler warns, the item turns amber and offers "Keep", which POSTs
 * api/gpuspawner/keep (that counts as activity, so the culler's clock starts again). A
 * GPU lease that its user may still extend offers "Extend": the hub's page for it opens
 * (the hub extends it, never this server).
 * Kernels the culler reclaimed are announced once each, as reclaimed for idleness, not
 * as a crash. All words come from the server: this file only lays them out.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import { IStatus, panelNode } from './panel';

const POLL_MS = 15000;
/** JupyterLab cuts a notification's message at this many characters. */
const NOTIFICATION_MAX = 140;

/** ``"analysis/train.ipynb: " + headline``, with the path shortened to fit a notification. */
function withPath(path: string | undefined, headline: string): string {
  if (!path) {
    return headline;
  }
  const room = NOTIFICATION_MAX - headline.length - 2;
  const name = path.length <= room ? path : path.split('/').pop() || path;
  if (name.length <= room) {
    return `${name}: ${headline}`;
  }
  return room > 1 ? `…${name.slice(name.length - room + 1)}: ${headline}` : headline;
}

class GpuStatus {
  constructor(app: JupyterFrontEnd) {
    this.app = app;
    this.settings = ServerConnection.makeSettings();
    this.item = new Widget();
    this.item.addClass('gpuspawner-status');
    this.item.id = 'gpuspawner-status';
    this.text = document.createElement('span');
    this.text.className = 'gpuspawner-status-text';
    this.text.textContent = 'GPU …';
    this.text.title = 'Your GPU: click for details';
    this.text.onclick = () => void this.openPanel();
    this.keepButton = document.createElement('button');
    this.keepButton.className = 'gpuspawner-keep jp-mod-styled jp-mod-warn';
    this.keepButton.textContent = 'Keep';
    this.keepButton.title = 'I am still here: keep my kernels and server';
    this.keepButton.onclick = () => void this.keep();
    this.keepButton.style.display = 'none';
    this.item.node.append(this.text, this.keepButton);
  }

  readonly item: Widget;

  async refresh(): Promise<void> {
    await this.rememberKernels();
    const response = await this.request('api/gpuspawner/status', { method: 'GET' });
    if (!response) {
      return;
    }
    this.show((await response.json()) as IStatus);
  }

  async keep(): Promise<void> {
    const response = await this.request('api/gpuspawner/keep', { method: 'POST' });
    if (response) {
      this.show((await response.json()) as IStatus);
      Notification.success('Kept: the idle clock starts again.', { autoClose: 4000 });
    }
  }

  private async request(path: string, init: RequestInit): Promise<Response | null> {
    const url = URLExt.join(this.settings.baseUrl, path);
    try {
      const response = await ServerConnection.makeRequest(url, init, this.settings);
      if (response.ok) {
        return response;
      }
      this.text.textContent = response.status === 404 ? 'GPU view not installed' : `GPU view: error ${response.status}`;
    } catch (reason) {
      this.text.textContent = 'GPU view: server not reachable';
    }
    return null;
  }

  private show(status: IStatus): void {
    this.status = status;
    const warning = status.notices.find(n => n.kind === 'warning');
    this.text.textContent = status.summary;
    this.item.toggleClass('gpuspawner-mod-warning', !!warning);
    // Keep only where activity can prevent the action (not a gpu_idle_limit stop or a GPU lease)
    const keepable = !!warning && warning.keep !== false;
    this.keepButton.style.display = keepable ? '' : 'none';
    if (!warning && this.warningToast) {
      Notification.dismiss(this.warningToast);
      this.warningToast = null;
    }
    if (warning && warning.at !== this.warnedAt) {
      this.warnedAt = warning.at;
      if (this.warningToast) {
        Notification.dismiss(this.warningToast);
      }
      this.warningToast = Notification.warning(warning.headline || warning.text, {
        autoClose: false,
        actions: [
          ...(keepable ? [{ label: 'Keep', callback: () => void this.keep(), displayType: 'warn' as const }] : []),
          ...(warning.extend_url ? [{ label: 'Extend', callback: () => void window.open(warning.extend_url, '_blank'), displayType: 'warn' as const }] : []),
          { label: 'Why?', callback: () => void this.openPanel(), displayType: 'link' as const }
        ]
      });
    }
    for (const notice of status.notices) {
      if (notice.kind !== 'reclaimed') {
        continue;
      }
      for (const id of notice.kernel_ids) {
        if (this.announced.has(id)) {
          continue;
        }
        this.announced.add(id);
        Notification.info(withPath(this.kernelPaths.get(id), notice.headline || notice.text), {
          autoClose: false,
          actions: [{ label: 'Why?', callback: () => void this.openPanel(), displayType: 'link' }]
        });
      }
    }
  }

  /** Which notebook each running kernel belongs to, so a reclaimed one can be named after it is gone. */
  private async rememberKernels(): Promise<void> {
    for (const session of this.app.serviceManager.sessions.running()) {
      if (session.kernel) {
        this.kernelPaths.set(session.kernel.id, session.path);
      }
    }
  }

  private async openPanel(): Promise<void> {
    await this.refresh();
    if (!this.status) {
      return;
    }
    const body = new Widget({ node: panelNode(this.status) });
    const warning = this.status.notices.some(n => n.kind === 'warning' && n.keep !== false);
    const buttons = warning
      ? [Dialog.cancelButton({ label: 'Close' }), Dialog.warnButton({ label: 'Keep' })]
      : [Dialog.okButton({ label: 'Close' })];
    const result = await showDialog({ title: 'Your GPU', body, buttons });
    if (warning && result.button.label === 'Keep') {
      await this.keep();
    }
  }

  private app: JupyterFrontEnd;
  private settings: ServerConnection.ISettings;
  private text: HTMLSpanElement;
  private keepButton: HTMLButtonElement;
  private status: IStatus | null = null;
  private warnedAt: string | null = null;
  private warningToast: string | null = null;
  private announced = new Set<string>();
  private kernelPaths = new Map<string, string>();
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpuspawner-gpu-view:plugin',
  description: 'Your GPU and the idle culler, in the status bar',
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    if (!statusBar) {
      return; // no status bar (Notebook 7): the plain page {base_url}gpuspawner/ has the same data
    }
    const view = new GpuStatus(app);
    statusBar.registerStatusItem('gpuspawner-gpu-view:status', { item: view.item, align: 'left', rank: 100 });
    void view.refresh();
    window.setInterval(() => void view.refresh(), POLL_MS);
  }
};

export default plugin;
